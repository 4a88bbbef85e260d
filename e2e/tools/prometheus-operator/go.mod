// Not built: the Prometheus Operator's CRDs (example/prometheus-operator-crd in its module),
// which tests/helm_chart.rs installs so the API server validates config/prometheus and the
// chart's ServiceMonitor and PrometheusRule against them. Pinned here like every Go tool.
module gpuqueue.io/e2e/prometheus-operator-crds

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
