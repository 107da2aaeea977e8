"""What the predictive daemon's /metrics say after a replay: the order its SSD tier ended
up following (the shadow caches' choice), its switches and the sampled requests seen on
each order, the shadows' hits, and the promotions it skipped."""

from __future__ import annotations

import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_LABELLED = {
    "attnstore_kvstore_shadow_hits": ("order", "shadow_hits_"),
    "attnstore_kvstore_promotions_skipped": ("reason", "promotions_skipped_"),
    "attnstore_kvstore_predictive_order_switches": ("order", "chooser_switches_to_"),
    "attnstore_kvstore_predictive_order_requests": ("order", "chooser_requests_on_"),
}


def chooser_summary(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    summary: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "attnstore_kvstore_predictive_order_followed":
            summary["chooser_follows"] = "predictive" if family.samples[0].value else "lru"
        elif family.name in _LABELLED:
            label, prefix = _LABELLED[family.name]
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    summary[prefix + sample.labels[label]] = int(sample.value)
    return summary
