"""Builds kernelhub/tuning/defaults/nvidia-h200.json (the path is argv[1]): the two JSON tables that came back, and the Mosaic GPU gradient
entries of the GPT-OSS / Mixtral run whose JSON was left out (from its markdown tables)."""
import copy, json, pathlib, re, sys

HERE = pathlib.Path(__file__).parent
run2 = json.load(open(HERE / 'tuning-deepseek-qwen3.json'))
run5 = json.load(open(HERE / 'tuning-gpt-oss-mixtral-rerun.json'))
entries = run2['entries'] + run5['entries']

def parse(md_path):
    text = open(md_path).read()
    summary = re.search(r'forward ([\d.]+) -> ([\d.]+) ms.*lhs_gradient ([\d.]+) -> ([\d.]+) ms.*'
                        r'rhs_gradient ([\d.]+) -> ([\d.]+) ms', text)
    times = {'lhs_gradient': (float(summary[3]), float(summary[4])),
             'rhs_gradient': (float(summary[5]), float(summary[6]))}
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip('|').split('|')]
        if len(cells) != 9 or cells[0] != 'gmm':
            continue
        _, groups, dtype, pass_name, kernel, tiling, ms, _, mark = cells
        name, dims = kernel.split()
        rows.setdefault(pass_name, []).append(
            dict(kernel=name, dims=[int(d) for d in dims.split('x')],
                 tiling=[int(t) for t in tiling.split('x')], ms=float(ms), mark=mark))
    return times, rows

template = next(e for e in run5['entries'] if e['implementation'] == 'mosaic')
added = []
for shape, groups in (('gpt-oss', 128), ('mixtral', 8)):
    md = HERE / f'tuning-{shape}-mosaic.md'
    times, rows = parse(md)
    for pass_name in ('lhs_gradient', 'rhs_gradient'):
        cands = rows[pass_name]
        default = next(r for r in cands if 'default' in r['mark'])
        winner = next(r for r in cands if 'winner' in r['mark'])
        m, k, n = winner['dims']
        e = copy.deepcopy(template)
        e.update(op='grouped_matmul', pass_name=pass_name, kernel=winner['kernel'], m=m, k=k, n=n,
                 num_groups=groups, local_groups=groups, tiling=winner['tiling'],
                 default_tiling=default['tiling'], default_ms=times[pass_name][0],
                 tuned_ms=times[pass_name][1],
                 groups=template['groups'] + f'; from tuning-{shape}-mosaic.md (2026-11-27-h200),'
                        ' whose run\'s JSON did not come back',
                 candidates=[[r['tiling'], r['ms']] for r in cands])
        added.append(e)
        # tgmm's keys of the same kernels: tgmm's forward is gmm's rhs_gradient kernel, tgmm's
        # lhs_gradient is gmm's lhs_gradient kernel (gmm_t), as the tuner files them.
        mirror = copy.deepcopy(e)
        mirror.update(op='transposed_grouped_matmul',
                      pass_name='forward' if pass_name == 'rhs_gradient' else 'lhs_gradient')
        added.append(mirror)

keys = lambda e: (e['implementation'], e['op'], e['pass_name'], e['kernel'], e['m'], e['k'],
                  e['n'], e['num_groups'], e['local_groups'], e['lhs_dtype'], e['rhs_dtype'],
                  e['out_dtype'], e['has_existing'])
seen = {keys(e) for e in entries}
for e in added:
    assert keys(e) not in seen, keys(e)
entries += added
assert len({keys(e) for e in entries}) == len(entries)
json.dump({'format': run2['format'], 'version': run2['version'], 'entries': entries},
          open(sys.argv[1], 'w'), indent=1)
print(len(entries), 'entries;', len(added), 'transcribed')
