"""Grafana dashboards as code: small builders (:mod:`dashboards.grafana`) and PDPair's two dashboards
(:mod:`dashboards.build`), written as JSON into ``charts/pdpair/dashboards/`` for the chart's ConfigMaps."""
