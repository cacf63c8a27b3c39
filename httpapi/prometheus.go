package httpapi

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// MetricsPortKey is the metadata key an instance sets to tell Prometheus
// the port its metrics are scraped on, when that is not the port of its
// address: GET /api/v1/prometheus/targets lists it as host:metrics_port
// (the host of its address). A value that is not a port (1..65535) is
// ignored: the instance's own address is listed.
const MetricsPortKey = "metrics_port"

// Label names of a Prometheus target group: MetaPrefix and the field, and
// for each metadata key MetaMetadataPrefix and the key made label-safe
// (LabelSafe). Prometheus drops the __meta_ labels after relabelling.
const (
	MetaPrefix         = "__meta_registry_"
	MetaMetadataPrefix = MetaPrefix + "metadata_"
)

// TargetGroup is one entry of Prometheus' http_sd_configs answer: the
// targets to scrape and the labels they share.
type TargetGroup struct {
	// Targets holds the one host:port of an instance.
	Targets []string `json:"targets"`
	// Labels are the instance's __meta_registry_* labels.
	Labels map[string]string `json:"labels"`
}

// prometheusTargets answers Prometheus' HTTP service discovery
// (http_sd_configs): every instance (of ?service=S, or of every service)
// as one target group, whatever its lifecycle and health, which are
// labels to relabel on. The scrape port is ?metrics_port=P for all, else
// the instance's metadata metrics_port, else its address's.
func (a *API) prometheusTargets(w http.ResponseWriter, r *http.Request) {
	e := query(r, "service", "metrics_port")
	q := r.URL.Query()
	service := q.Get("service")
	if e == nil && q.Has("service") {
		if err := record.ValidService(service); err != nil {
			e = fieldError(err, "service")
		}
	}
	port := ""
	if e == nil && q.Has("metrics_port") {
		if port = q.Get("metrics_port"); !validPort(port) {
			e = badField("metrics_port", "%q is not a port (1..65535)", port)
		}
	}
	if e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	insts, rev, err := a.listPages(r, service)
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	groups := make([]TargetGroup, 0, len(insts))
	for _, in := range insts {
		groups = append(groups, targetGroup(in, port))
	}
	slices.SortFunc(groups, func(x, y TargetGroup) int {
		return strings.Compare(x.Labels[MetaPrefix+"service"]+"/"+x.Labels[MetaPrefix+"id"],
			y.Labels[MetaPrefix+"service"]+"/"+y.Labels[MetaPrefix+"id"])
	})
	w.Header().Set("X-Registry-Revision", strconv.FormatInt(rev, 10))
	writeJSON(w, http.StatusOK, groups)
}

// listPages lists every instance of service ("" every service) through
// every page of one listing, all read at one revision.
func (a *API) listPages(r *http.Request, service string) ([]*registryv1.Instance, int64, error) {
	ctx, cancel := a.call(r)
	defer cancel()
	var (
		all []*registryv1.Instance
		rev int64
		tok string
	)
	for {
		resp, err := a.rpc.List(ctx, &registryv1.ListRequest{Service: service, PageToken: tok})
		if err != nil {
			return nil, 0, err
		}
		all, rev, tok = append(all, resp.GetInstances()...), resp.GetRevision(), resp.GetNextPageToken()
		if tok == "" {
			return all, rev, nil
		}
	}
}

// targetGroup is in as a Prometheus target group, scraped on port if not
// "".
func targetGroup(in *registryv1.Instance, port string) TargetGroup {
	host, own, err := net.SplitHostPort(in.GetAddress())
	target := in.GetAddress()
	if err == nil {
		if port == "" {
			if p := in.GetMetadata()[MetricsPortKey]; validPort(p) {
				port = p
			}
		}
		if port != "" && port != own {
			target = net.JoinHostPort(host, port)
		}
	}
	weight := in.GetWeight()
	if weight == 0 {
		weight = record.DefaultWeight
	}
	labels := map[string]string{
		MetaPrefix + "service":   in.GetService(),
		MetaPrefix + "id":        in.GetId(),
		MetaPrefix + "zone":      in.GetZone(),
		MetaPrefix + "version":   in.GetVersion(),
		MetaPrefix + "health":    render.HealthState(in.GetHealth().GetState()),
		MetaPrefix + "lifecycle": render.Lifecycle(in.GetLifecycle()),
		MetaPrefix + "weight":    strconv.FormatUint(uint64(weight), 10),
	}
	// Two keys may make one label ("a.b", "a_b"): the first in byte order
	// wins, so the answer does not depend on map order.
	keys := make([]string, 0, len(in.GetMetadata()))
	for k := range in.GetMetadata() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := MetaMetadataPrefix + LabelSafe(k)
		if _, taken := labels[name]; !taken {
			labels[name] = in.GetMetadata()[k]
		}
	}
	return TargetGroup{Targets: []string{target}, Labels: labels}
}

// LabelSafe is s with every byte outside [a-zA-Z0-9_] replaced by '_',
// as Prometheus' own service discoveries make label names of keys.
func LabelSafe(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// validPort reports whether s is a decimal port 1..65535.
func validPort(s string) bool {
	p, err := strconv.ParseUint(s, 10, 16)
	return err == nil && p > 0 && s == strconv.FormatUint(p, 10)
}
