"""What people read: the HTML report, figures, tables, terminal text."""

from wattlab.analysis.report.export_table import TableWriter, format_of, tidy_rows
from wattlab.analysis.report.html_report import ReportOptions, build_report
from wattlab.analysis.report.sparse_text import format_evaluation, format_recommendation

__all__ = [
    "ReportOptions",
    "TableWriter",
    "build_report",
    "format_evaluation",
    "format_of",
    "format_recommendation",
    "tidy_rows",
]
