#!/usr/bin/python3
"""Reads a Prometheus text exposition on stdin with the official Python client's parser (Debian's
python3-prometheus-client) and prints its samples as one JSON array of {"family", "type", "name", "labels",
"value"}. Exits non-zero (the parser's error on stderr) when the text does not parse."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

samples = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        samples.append({"family": family.name, "type": family.type, "name": s.name, "labels": s.labels,
                        "value": s.value})
json.dump(samples, sys.stdout, allow_nan=False)
