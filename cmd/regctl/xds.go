package main

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"github.com/spf13/cobra"
)

func newXDSCmd(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "xds",
		Short: "Help xDS clients (proxyless gRPC, Envoy) find the regnodes",
		Long: `regnodes serve xDS (ADS) on their API port: proxyless gRPC in any language
calls xds:///SERVICE with nothing but a bootstrap file naming them, and
Envoy takes each service as a cluster. See docs/xds.md.`,
		Args: nArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newXDSBootstrapCmd(o), newXDSClientsCmd(o))
	return cmd
}

// xdsBootstrapFlags are regctl xds bootstrap's own flags.
type xdsBootstrapFlags struct {
	zone, nodeID string
	envoy        bool
}

// maxNodeIDLen bounds --node-id: node ids travel on every xDS request
// and name the client in regnode's logs.
const maxNodeIDLen = 128

func newXDSBootstrapCmd(o *options) *cobra.Command {
	var f xdsBootstrapFlags
	cmd := &cobra.Command{
		Use:   "bootstrap",
		Short: "Print an xDS bootstrap naming the regnodes (gRPC's, or Envoy's with --envoy)",
		Long: `Print an xDS bootstrap file naming the regnodes of --endpoints (else
$REGCTL_ENDPOINTS, else the default), for a client to call xds:///SERVICE
through them. Nothing is sent to a regnode. The output is JSON whatever -o says.

gRPC (Go, Java, C++, Python, Node): write it to a file and point
GRPC_XDS_BOOTSTRAP at it. One xds_servers entry per endpoint: the client
talks to the first and falls back to the next ones while it is unreachable
(gRFC A71; older clients use the first only). channel_creds is "insecure",
or with --cacert/--cert/--key (else their variables) "tls" with the files'
absolute paths (gRFC A65: grpc-go, and other languages' releases that
implement it).

--envoy prints an Envoy bootstrap instead: a static cluster "regnode_ads" of
the endpoints (HTTP/2, TLS with --cacert), ADS over it, and clusters (CDS)
over ADS: each service S is then Envoy's cluster S, with its endpoints over
EDS. regnode's Listeners are gRPC API listeners, which Envoy takes only from
its bootstrap, so Envoy's listeners and routes stay your own: route to
cluster S.

--node-id names the client (default: this host's name and a random
suffix: give each client process its own); --zone is the node's
locality.zone: a gRPC client prefers its zone's instances while one is
usable.`,
		Example: `  regctl --endpoints 10.0.0.1:7400,10.0.0.2:7400 xds bootstrap --zone eu-1 > /etc/grpc-xds.json
  GRPC_XDS_BOOTSTRAP=/etc/grpc-xds.json ./my-client   # dials xds:///orders
  regctl xds bootstrap --envoy --node-id edge-1 > envoy.json && envoy -c envoy.json`,
		Args: nArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.xdsBootstrap(f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.zone, "zone", "", "the client's zone (node locality.zone): gRPC clients prefer its instances")
	fl.StringVar(&f.nodeID, "node-id", "", "the client's node id (default <hostname>-<random>)")
	fl.BoolVar(&f.envoy, "envoy", false, "print an Envoy bootstrap instead of gRPC's")
	return cmd
}

// validZone is the zone rule regnode applies to a node's locality.zone
// (xds/variant.go): at most 63 printable characters, no '|'. regnode
// would ignore another zone silently; regctl refuses it.
func validZone(z string) error {
	if len(z) > 63 {
		return usagef("invalid --zone: %d bytes, at most 63", len(z))
	}
	if i := strings.IndexFunc(z, func(r rune) bool { return !unicode.IsPrint(r) || r == '|' }); i >= 0 {
		return usagef("invalid --zone %q: character %q is not allowed (printable characters other than '|' only)", z, z[i:i+1])
	}
	return nil
}

// validNodeID: non-empty, at most maxNodeIDLen printable characters.
func validNodeID(id string) error {
	switch {
	case id == "" || strings.TrimSpace(id) != id:
		return usagef("invalid --node-id %q: empty, or with leading or trailing space", id)
	case len(id) > maxNodeIDLen:
		return usagef("invalid --node-id: %d bytes, at most %d", len(id), maxNodeIDLen)
	case strings.IndexFunc(id, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return usagef("invalid --node-id %q: printable characters only", id)
	}
	return nil
}

// defaultNodeID is <hostname>-<8 random hex digits>.
func defaultNodeID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "xds-client"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%x", host, b)
}

// The gRPC bootstrap (gRFC A27; grpc-go's internal/xds/bootstrap reads
// it), fields in the order the docs show them.
type grpcBootstrap struct {
	XDSServers []grpcXDSServer `json:"xds_servers"`
	Node       bootstrapNode   `json:"node"`
}

type grpcXDSServer struct {
	ServerURI      string         `json:"server_uri"`
	ChannelCreds   []channelCreds `json:"channel_creds"`
	ServerFeatures []string       `json:"server_features"`
}

type channelCreds struct {
	Type   string     `json:"type"`
	Config *tlsConfig `json:"config,omitempty"`
}

// tlsConfig is the "tls" channel credentials' config (gRFC A65).
type tlsConfig struct {
	CACertificateFile string `json:"ca_certificate_file,omitempty"`
	CertificateFile   string `json:"certificate_file,omitempty"`
	PrivateKeyFile    string `json:"private_key_file,omitempty"`
}

type bootstrapNode struct {
	ID       string    `json:"id"`
	Cluster  string    `json:"cluster,omitempty"`
	Locality *zoneOnly `json:"locality,omitempty"`
}

// zoneOnly is the node's locality: always present, empty without a zone
// (@grpc/grpc-js-xds refuses a bootstrap whose node has no locality).
type zoneOnly struct {
	Zone string `json:"zone,omitempty"`
}

// envoyCluster is the name of the Envoy bootstrap's static cluster of
// regnodes.
const envoyCluster = "regnode_ads"

func (o *options) xdsBootstrap(f xdsBootstrapFlags) error {
	eps, err := o.resolveEndpoints()
	if err != nil {
		return err
	}
	if err := validZone(f.zone); err != nil {
		return err
	}
	if f.nodeID == "" {
		f.nodeID = defaultNodeID()
	} else if err := validNodeID(f.nodeID); err != nil {
		return err
	}
	files := o.tlsFiles()
	if files.Enabled() {
		// The files are checked as every other command checks them (the
		// CA parses, the key pair loads), then named by absolute path:
		// the client reads them from its own working directory.
		if _, err := o.transport(slog.New(slog.DiscardHandler)); err != nil {
			return err
		}
		for _, p := range []*string{&files.CAFile, &files.CertFile, &files.KeyFile} {
			if *p == "" {
				continue
			}
			if *p, err = filepath.Abs(*p); err != nil {
				return err
			}
		}
	}
	node := bootstrapNode{ID: f.nodeID, Locality: &zoneOnly{Zone: f.zone}}
	if f.envoy {
		node.Cluster = "regnode-xds-clients"
		return o.printJSON(envoyBootstrap(eps, files.Enabled(), tlsConfig{
			CACertificateFile: files.CAFile, CertificateFile: files.CertFile, PrivateKeyFile: files.KeyFile}, node))
	}
	creds := channelCreds{Type: "insecure"}
	if files.Enabled() {
		creds = channelCreds{Type: "tls", Config: &tlsConfig{
			CACertificateFile: files.CAFile, CertificateFile: files.CertFile, PrivateKeyFile: files.KeyFile}}
	}
	b := grpcBootstrap{Node: node}
	for _, ep := range eps {
		b.XDSServers = append(b.XDSServers, grpcXDSServer{ServerURI: ep,
			ChannelCreds: []channelCreds{creds}, ServerFeatures: []string{"xds_v3"}})
	}
	return o.printJSON(b)
}

// obj keeps the Envoy bootstrap readable: Envoy's schema is large and
// only a few fields of it are set.
type obj = map[string]any

// envoyBootstrap is an Envoy (v3) bootstrap: the regnodes as static
// cluster regnode_ads (HTTP/2, as gRPC needs; STATIC when every endpoint
// is an IP address, else STRICT_DNS), ADS over it, CDS over ADS. No
// lds_config: regnode's Listeners are gRPC API listeners, which Envoy
// refuses over LDS.
func envoyBootstrap(eps []string, useTLS bool, files tlsConfig, node bootstrapNode) obj {
	kind := "STATIC"
	var lbEndpoints []any
	sni := ""
	for _, ep := range eps {
		host, port, _ := net.SplitHostPort(ep) // validated by parseEndpoints
		p, _ := strconv.Atoi(port)
		if net.ParseIP(host) == nil {
			kind = "STRICT_DNS"
			if sni == "" {
				sni = host
			}
		}
		lbEndpoints = append(lbEndpoints, obj{"endpoint": obj{"address": obj{
			"socket_address": obj{"address": host, "port_value": p}}}})
	}
	cluster := obj{
		"name":            envoyCluster,
		"type":            kind,
		"connect_timeout": "1s",
		"load_assignment": obj{"cluster_name": envoyCluster, "endpoints": []any{obj{"lb_endpoints": lbEndpoints}}},
		"typed_extension_protocol_options": obj{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": obj{
				"@type":                "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
				"explicit_http_config": obj{"http2_protocol_options": obj{}},
			},
		},
	}
	if useTLS {
		common := obj{}
		if files.CACertificateFile != "" {
			common["validation_context"] = obj{"trusted_ca": obj{"filename": files.CACertificateFile}}
		}
		if files.CertificateFile != "" {
			common["tls_certificates"] = []any{obj{
				"certificate_chain": obj{"filename": files.CertificateFile},
				"private_key":       obj{"filename": files.PrivateKeyFile}}}
		}
		upstream := obj{
			"@type":              "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
			"common_tls_context": common,
		}
		if sni != "" {
			upstream["sni"] = sni
		}
		cluster["transport_socket"] = obj{"name": "envoy.transport_sockets.tls", "typed_config": upstream}
	}
	n := obj{"id": node.ID, "cluster": node.Cluster}
	if node.Locality.Zone != "" {
		n["locality"] = obj{"zone": node.Locality.Zone}
	}
	return obj{
		"node":             n,
		"static_resources": obj{"clusters": []any{cluster}},
		"dynamic_resources": obj{
			"ads_config": obj{
				"api_type":              "GRPC",
				"transport_api_version": "V3",
				"grpc_services":         []any{obj{"envoy_grpc": obj{"cluster_name": envoyCluster}}},
			},
			"cds_config": obj{"ads": obj{}, "resource_api_version": "V3"},
		},
	}
}
