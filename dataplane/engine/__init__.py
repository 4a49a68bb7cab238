"""Engines that drive a sidecar agent through the local API (``dataplane.localapi``): the synthetic
engine process, which stands where a serving engine (sglang, vLLM) would."""
