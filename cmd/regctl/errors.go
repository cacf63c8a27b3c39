package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/record"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // the command line is wrong; nothing was sent
)

// usageError is a mistake on the command line: unknown command or flag,
// wrong number of arguments, a malformed value. It exits 2 with a hint to
// the command's --help.
type usageError struct {
	cmd string // command path for the hint, e.g. "regctl list"
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// notFoundError is an instance that does not exist.
type notFoundError struct{ service, id string }

func (e *notFoundError) Error() string { return fmt.Sprintf("%s/%s not found", e.service, e.id) }

// exitCode is the process exit code for err.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}

// describe is the one line regctl prints for err (without the "regctl: "
// prefix): the validation failure naming its field, the regnode's own
// message, or what went wrong reaching a regnode.
func describe(err error, o *options) string {
	var ue *usageError
	if errors.As(err, &ue) {
		cmd := ue.cmd
		if cmd == "" {
			cmd = "regctl"
		}
		return fmt.Sprintf("%s (see '%s --help')", ue.msg, cmd)
	}
	var nf *notFoundError
	if errors.As(err, &nf) {
		return nf.Error()
	}
	var gu *gaveUpError
	if errors.As(err, &gu) {
		return oneLine(gu.msg)
	}
	var fe *record.FieldError
	if errors.As(err, &fe) {
		return fe.Error()
	}
	if st, ok := grpcStatus(err); ok {
		switch st.Code() {
		case codes.Unavailable:
			if isDialFailure(st.Message()) {
				return fmt.Sprintf("cannot reach a regnode at %s: %s", o.endpointList(), oneLine(st.Message()))
			}
			return "regnode unavailable: " + oneLine(st.Message())
		case codes.DeadlineExceeded:
			return noAnswer(o)
		case codes.Canceled:
			return "interrupted"
		}
		return oneLine(st.Message())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return noAnswer(o)
	}
	return oneLine(err.Error())
}

func noAnswer(o *options) string {
	return fmt.Sprintf("no answer from a regnode at %s within %s (--timeout)", o.endpointList(), o.timeout)
}

// grpcStatus finds the gRPC status an error carries, however wrapped. Unlike
// status.FromError it keeps the status's own message.
func grpcStatus(err error) (*status.Status, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		if st := se.GRPCStatus(); st != nil {
			return st, true
		}
	}
	return nil, false
}

// isDialFailure tells a connection that could not be made (the regnode is
// down or the address wrong) from a regnode that answered "unavailable"
// (its etcd has no leader, say).
func isDialFailure(msg string) bool {
	for _, s := range []string{"connection error", "Error while dialing", "connect:", "no such host", "connection refused", "produced zero addresses",
		// A TLS server that refused our certificate after the handshake:
		// the first write finds the connection gone.
		"broken pipe", "connection reset by peer"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// oneLine folds a multi-line message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// gaveUpError is a command that retried until --timeout and gave up
// (register's first registration); last is the final attempt's error, so
// the hint can tell an unreachable regnode from one that answered.
type gaveUpError struct {
	msg  string
	last error
}

func (e *gaveUpError) Error() string { return e.msg }

// unreachable reports whether err means no regnode answered at the
// endpoints: the connection could not be made, or nothing came back
// within --timeout.
func unreachable(err error) bool {
	var gu *gaveUpError
	if errors.As(err, &gu) {
		return unreachable(gu.last)
	}
	if st, ok := grpcStatus(err); ok {
		switch st.Code() {
		case codes.Unavailable:
			return isDialFailure(st.Message())
		case codes.DeadlineExceeded:
			return true
		}
		return false
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// hint is appended to the error line when no regnode answered: how to
// point regctl at another, worded by where the endpoints came from. It is
// "" for every other error.
func hint(err error, o *options) string {
	if err == nil || !unreachable(err) || len(o.endpoints) == 0 {
		return ""
	}
	switch o.endpointsFrom {
	case "--endpoints":
		return "; check --endpoints (the host:port of regnodes' --listen, comma-separated; it wins over $" + envEndpoints + ")"
	case "$" + envEndpoints:
		return "; the endpoints came from $" + envEndpoints + ": change it, or give --endpoints host:port,..."
	}
	return "; is a regnode running there? " + client.DefaultEndpoint + " is only the default: point regctl at your regnodes with --endpoints host:port,... or $" + envEndpoints
}
