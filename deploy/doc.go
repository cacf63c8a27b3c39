// Package deploy holds no code: it is the nested module whose tests check
// the deployment files beside it (Prometheus alert rules, the Grafana
// dashboard, the Kubernetes manifest) against what regnode really exports
// and accepts. It is a module of its own so that Prometheus' rule parser
// and its dependencies stay out of the registry's own go.mod.
package deploy
