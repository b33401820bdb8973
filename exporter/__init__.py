"""GPU observability and cost analytics for Google Kubernetes Engine."""

from importlib.metadata import version

__version__ = version("gke-gpu-exporter")
"""The installed distribution's version: what ``--version`` prints and build_info says."""
