package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/tlsfiles"
)

// envEndpoints is the environment variable read when --endpoints is not
// given.
const envEndpoints = "REGCTL_ENDPOINTS"

// The variables read when --cacert, --cert or --key is not given.
const (
	envCACert = "REGCTL_CACERT"
	envCert   = "REGCTL_CERT"
	envKey    = "REGCTL_KEY"
)

// defaultTimeout bounds every call to a regnode unless --timeout says
// otherwise.
const defaultTimeout = 5 * time.Second

// options are the global flags and the process's streams, shared by every
// command.
type options struct {
	endpointsFlag string
	endpoints     []string // resolved by connect
	endpointsFrom string   // where endpoints came from, for hints: "--endpoints", "$REGCTL_ENDPOINTS" or "default"
	timeout       time.Duration
	output        string
	tls           tlsfiles.Client // --cacert, --cert, --key (etcdctl's names)
	token         string          // --token (else $REGCTL_TOKEN): token.go

	stdout, stderr io.Writer
	getenv         func(string) string

	// started is set once the command line has been parsed and a command
	// is about to run: an untyped error before that is cobra's, a usage
	// error.
	started bool
}

// run executes regctl with args and returns the process exit code. It
// prints errors itself: one line on stderr prefixed "regctl: ".
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	o := &options{stdout: stdout, stderr: stderr, getenv: getenv}
	root := newRootCmd(o)
	if args == nil {
		args = []string{} // nil would make cobra read os.Args
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var ue *usageError
	if !errors.As(err, &ue) && !o.started {
		// Cobra's own complaints (unknown subcommand of a command with
		// subcommands, and the like) are usage errors.
		ue = &usageError{msg: err.Error()}
		err = ue
	}
	if ue != nil && ue.cmd == "" && cmd != nil {
		ue.cmd = cmd.CommandPath()
	}
	fmt.Fprintf(stderr, "regctl: %s%s\n", describe(err, o), hint(err, o))
	return exitCode(err)
}

// newRootCmd builds the command tree.
func newRootCmd(o *options) *cobra.Command {
	root := &cobra.Command{
		Use:   "regctl",
		Short: "regctl operates an etcd-backed service registry through its regnodes",
		Long: `regctl operates an etcd-backed service registry through its regnodes.

It lists services and instances, registers an instance from the shell,
drains, undrains and deregisters instances, follows their changes,
shows cluster status, and prints xDS bootstraps naming the regnodes.
Endpoints come from --endpoints, else $REGCTL_ENDPOINTS, else 127.0.0.1:7400.
--cacert, --cert and --key (else $REGCTL_CACERT, $REGCTL_CERT, $REGCTL_KEY)
talk TLS to regnodes serving it, as etcdctl's do to etcd.
--token (else $REGCTL_TOKEN) is sent on every call to regnodes run with
--auth; see 'regctl token --help'.

Exit status: 0 on success, 1 when the command failed, 2 on a usage error.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.ArbitraryArgs,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := parseOutput(o.output); err != nil {
				return err
			}
			if o.timeout <= 0 {
				return usagef("invalid --timeout %s: must be positive", o.timeout)
			}
			o.started = true
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf("; did you mean %q?", s[0])
			}
			return &usageError{cmd: cmd.CommandPath(), msg: msg}
		},
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	root.SuggestionsMinimumDistance = 2
	// The root runs only to report an unknown command: its usage shows
	// "regctl [command]", not "regctl [flags]".
	root.SetUsageTemplate(strings.Replace(root.UsageTemplate(), "Usage:{{if .Runnable}}", "Usage:{{if and .Runnable .HasParent}}", 1))
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &usageError{cmd: c.CommandPath(), msg: err.Error()}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&o.endpointsFlag, "endpoints", "", "regnode API addresses, host:port,... (default $"+envEndpoints+" or "+client.DefaultEndpoint+")")
	pf.DurationVar(&o.timeout, "timeout", defaultTimeout, "how long to wait for a regnode's answer")
	pf.StringVarP(&o.output, "output", "o", outTable, "output format: table, wide or json")
	pf.StringVar(&o.tls.CAFile, "cacert", "", "talk TLS, trusting this CA's certificates (PEM; default $"+envCACert+")")
	pf.StringVar(&o.tls.CertFile, "cert", "", "client certificate for a regnode that asks for one (PEM; default $"+envCert+")")
	pf.StringVar(&o.tls.KeyFile, "key", "", "private key of --cert (PEM; default $"+envKey+")")
	pf.StringVar(&o.token, "token", "", "scoped token sent on every call, for regnodes run with --auth (default $"+envToken+"; prefer the variable: a flag shows in ps)")

	root.AddCommand(
		newServicesCmd(o),
		newListCmd(o),
		newGetCmd(o),
		newRegisterCmd(o),
		newDrainCmd(o),
		newUndrainCmd(o),
		newDeregisterCmd(o),
		newStatusCmd(o),
		newWatchCmd(o),
		newVersionCmd(o),
		newTokenCmd(o),
		newXDSCmd(o),
	)
	return root
}

// nArgs accepts between min and max positional arguments, named in the
// error.
func nArgs(min, max int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) >= min && len(args) <= max {
			return nil
		}
		var want string
		switch {
		case max == 0:
			want = "no arguments"
		case min == max:
			want = fmt.Sprintf("exactly %s", names)
		default:
			want = fmt.Sprintf("at most %s", names)
		}
		return &usageError{cmd: cmd.CommandPath(), msg: fmt.Sprintf("%s takes %s, got %d argument(s)", cmd.CommandPath(), want, len(args))}
	}
}

// resolveEndpoints picks --endpoints, else $REGCTL_ENDPOINTS, else the
// default.
func (o *options) resolveEndpoints() ([]string, error) {
	s, from := o.endpointsFlag, "--endpoints"
	if s == "" && o.getenv != nil {
		s, from = o.getenv(envEndpoints), "$"+envEndpoints
	}
	if s == "" {
		s, from = client.DefaultEndpoint, "default"
	}
	o.endpointsFrom = from
	eps, err := parseEndpoints(s)
	if err != nil {
		return nil, err
	}
	o.endpoints = eps
	return eps, nil
}

// connect returns a client of the endpoints; logger receives the SDK's
// logs (nil discards them).
func (o *options) connect(logger *slog.Logger) (*client.Client, error) {
	eps, err := o.resolveEndpoints()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tlsCfg, err := o.transport(logger)
	if err != nil {
		return nil, err
	}
	tok, err := o.resolveToken()
	if err != nil {
		return nil, err
	}
	c, err := client.New(client.Config{Endpoints: eps, Logger: logger, TLS: tlsCfg, Token: tok})
	if errors.Is(err, client.ErrInsecureToken) {
		return nil, fmt.Errorf("refusing to send the token in plaintext to %s, off this host: talk TLS (--cacert)", o.endpointList())
	}
	return c, err
}

// tlsFiles is --cacert, --cert and --key, each else from its variable.
func (o *options) tlsFiles() tlsfiles.Client {
	files := o.tls
	for _, v := range []struct {
		dst *string
		env string
	}{{&files.CAFile, envCACert}, {&files.CertFile, envCert}, {&files.KeyFile, envKey}} {
		if *v.dst == "" && o.getenv != nil {
			*v.dst = o.getenv(v.env)
		}
	}
	return files
}

// transport is the TLS configuration of --cacert, --cert and --key (each
// else from its variable), or nil for plaintext when none is set.
func (o *options) transport(logger *slog.Logger) (*tls.Config, error) {
	files := o.tlsFiles()
	if !files.Enabled() {
		return nil, nil
	}
	if err := files.Validate("--cert", "--key"); err != nil {
		return nil, &usageError{msg: err.Error()}
	}
	cfg, err := files.Config(logger)
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	return cfg, nil
}

// callCtx bounds one call to a regnode by --timeout.
func (o *options) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, o.timeout)
}

// printJSON writes v as indented JSON followed by a newline.
func (o *options) printJSON(v any) error {
	enc := json.NewEncoder(o.stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJSONLine writes v as one line of JSON.
func (o *options) printJSONLine(v any) error {
	enc := json.NewEncoder(o.stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// wide reports whether -o wide was asked for.
func (o *options) wide() bool { return o.output == outWide }

// json reports whether -o json was asked for.
func (o *options) json() bool { return o.output == outJSON }

// endpointList is the endpoints for messages.
func (o *options) endpointList() string { return strings.Join(o.endpoints, ",") }
