"""Builds kernelhub/tuning/defaults/nvidia-h100-80gb-hbm3.json (the path is argv[1]) from this
folder's two tune runs. Each run's tuning.json holds its own tuned entries and the table shipped
before it (the scoreboard's times) for every other key, so the second run does not carry the
first's tune: per key, a tuned entry wins over a scoreboard one."""
import json, pathlib, sys

HERE = pathlib.Path(__file__).parent
RUNS = ('tuning-deepseek-qwen3.json', 'tuning-gpt-oss-mixtral.json')
VALUES = {'tiling', 'default_tiling', 'tuned_ms', 'default_ms', 'groups', 'candidates'}


def key(entry):
    return tuple(sorted((name, str(value)) for name, value in entry.items() if name not in VALUES))


def tuned(entry):
    return not entry['groups'].startswith('the scoreboard')


tables = [json.load(open(HERE / run)) for run in RUNS]
merged = {}
for entry in (entry for table in tables for entry in table['entries']):
    held = merged.get(key(entry))
    if held is not None and tuned(held) and tuned(entry):
        raise SystemExit(f'two runs tuned {key(entry)}')
    if held is None or tuned(entry):
        merged[key(entry)] = entry
table = dict(tables[-1], entries=list(merged.values()))
with open(sys.argv[1], 'w') as file:
    json.dump(table, file, indent=1)
print(f'{len(merged)} entries, {sum(map(tuned, merged.values()))} tuned, to {sys.argv[1]}')
