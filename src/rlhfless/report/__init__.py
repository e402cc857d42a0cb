"""HTML report of recorded runs (figures drawn with matplotlib Agg); imports neither torch nor ray."""

from rlhfless.report.build import write_report

__all__ = ["write_report"]
