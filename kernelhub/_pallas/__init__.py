"""Pallas kernels, one subpackage per hardware: tpu/ (Mosaic) and gpu/.

Each subpackage registers its kernels when imported (kernelhub/__init__.py imports them); this
package itself does nothing on import.
"""
