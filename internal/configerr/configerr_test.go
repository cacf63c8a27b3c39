package configerr

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/regcluster/registry/record"
)

var (
	errA = errors.New("a: invalid config")
	errB = errors.New("b: invalid config")
)

func TestMessages(t *testing.T) {
	cause := errors.New("not a service name")
	for _, tc := range []struct {
		err  error
		want string
	}{
		{New(errA, "a", "Interval", -time.Second, "must be >= 0"), "a: Config.Interval must be >= 0, got -1s"},
		{New(errA, "a", "Name", "x y", "must be a name"), `a: Config.Name must be a name, got "x y"`},
		{Required(errA, "a", "Client"), "a: Config.Client is required"},
		{Because(errA, "a", "Service", "Bad", cause), `a: Config.Service is invalid, got "Bad": not a service name`},
		{Within(errB, "b", "A", New(errA, "a", "Size", -1, "must be >= 0")), "b: Config.A.Size must be >= 0, got -1"},
		{Within(errB, "b", "A", cause), "b: Config.A is invalid: not a service name"},
		{New(errA, "a", "MinBackoff", -time.Second, "must be >= 0").Of("SubscribeOptions"), "a: SubscribeOptions.MinBackoff must be >= 0, got -1s"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
	if Within(errB, "b", "A", nil) != nil {
		t.Error("Within(nil) is not nil")
	}
}

func TestWrapsSentinels(t *testing.T) {
	cause := errors.New("cause")
	inner := Because(errA, "a", "X", 1, cause)
	outer := fmt.Errorf("start: %w", Within(errB, "b", "A", inner))
	for _, want := range []error{errA, errB, cause} {
		if !errors.Is(outer, want) {
			t.Errorf("%v does not wrap %v", outer, want)
		}
	}
	var e *Error
	if !errors.As(outer, &e) || e.Component != "b" || e.Field != "A.X" || e.Value != 1 {
		t.Fatalf("errors.As: %+v", e)
	}
	var fe *record.FieldError
	if !errors.As(outer, &fe) || fe.Field != "Config.A.X" || fe.Reason != "is invalid, got 1: cause" {
		t.Errorf("errors.As *record.FieldError: %+v", fe)
	}
	if errors.Is(New(errA, "a", "X", 1, "r"), errB) {
		t.Error("a's error wraps b's sentinel")
	}
}
