// Package deploy holds the tests that keep the deployment artefacts honest:
// the static build, the Helm chart in helm/, the Grafana dashboard in
// grafana/, the Prometheus alerts, and (behind the container build tag) the
// real image run under podman.
//
// It is its own Go module so that Helm, the Kubernetes API types and the
// PromQL parser, which only these tests need, never enter the provider's
// dependency graph. It reaches the provider's packages (config, metrics,
// api) through a replace directive, so the chart's container arguments are
// validated by exactly the code the binary runs.
package deploy
