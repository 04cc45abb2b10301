"""``make paper``: Jäger et al. (2018) re-run on this project -- its design on the existing grids, its findings
set against ours (docs/paper.md)."""
