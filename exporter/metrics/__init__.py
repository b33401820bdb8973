"""The exporter's series: the catalogue of metric families every output reads, and the
health of each source and sink as those series show it."""
