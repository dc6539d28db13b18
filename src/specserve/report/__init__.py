"""Benchmark results → self-contained HTML (inline SVG), Markdown tables, CloudWatch EMF."""

from specserve.report.html import render_html, write_report

__all__ = ["render_html", "write_report"]
