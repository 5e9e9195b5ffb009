"""Cache figures of SGLang servers: pure parsing/aggregation (``sglang_metrics``) and the HTTP
scrape (``scrape``)."""

