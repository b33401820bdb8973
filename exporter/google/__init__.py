"""Clients of Google's APIs shared by sources and sinks (Cloud Monitoring, the Cloud
Billing catalogue), and the local BigQuery emulator the demo and the tests run."""
