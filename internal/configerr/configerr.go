// Package configerr is the one way a component of the registry refuses a
// setting. Every component has a Config, a DefaultConfig() that states each
// default, and a Validate() that returns the first field that cannot work as
// an *Error:
//
//	watch: Config.ProgressInterval must be >= 0 (0: the default 1s), got -1s
//
// naming the component, the field (its path below Config) and the value, and
// wrapping the component's own sentinel (ErrInvalidConfig in each package), so
// a caller branches with errors.Is(err, watch.ErrInvalidConfig) on one
// component, or with errors.As(err, new(*configerr.Error)) on any (cmd/regnode
// maps the field to its flag that way). New and Start call Validate and
// return its error; nothing is corrected silently. Where a zero value means
// "the default" (documented per field), Validate checks the value the
// component will run with, after the defaults are filled.
package configerr

import (
	"errors"
	"fmt"

	"github.com/regcluster/registry/record"
)

// Error is one Config field a Validate refused.
type Error struct {
	// Component is the package whose Config it is ("watch").
	Component string
	// Struct is the refused struct's type name ("": "Config"; a
	// component configured by options says "SubscribeOptions").
	Struct string
	// Field is the field's path below Config ("ProgressInterval",
	// "Limits.WriteRate" for a nested component's).
	Field string
	// Value is the refused value; nil for a required field left unset.
	Value any
	// Rule says what the field must be ("must be > 0", "is required").
	Rule string

	kind  error // the component's ErrInvalidConfig
	cause error // why, when another check said so (shown after the rule)
	inner error // the nested component's *Error this one restates (not shown)
}

// New is the refusal of field of component's Config, wrapping kind.
func New(kind error, component, field string, value any, rule string) *Error {
	return &Error{Component: component, Field: field, Value: value, Rule: rule, kind: kind}
}

// Required is the refusal of a required field left unset.
func Required(kind error, component, field string) *Error {
	return &Error{Component: component, Field: field, Rule: "is required", kind: kind}
}

// Because is New with the error of the check that refused value (a
// record.FieldError, say), shown after the rule and wrapped.
func Because(kind error, component, field string, value any, cause error) *Error {
	return &Error{Component: component, Field: field, Value: value, Rule: "is invalid", kind: kind, cause: cause}
}

// Within restates err, a nested component's refusal, as one of field (a
// Config field holding that component's Config) of component's Config:
// "node: Config.Limits.WriteRate ...". The result wraps kind and err (so
// errors.Is finds both sentinels). An err that is not an *Error is wrapped
// as the cause of field.
func Within(kind error, component, field string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if !errors.As(err, &e) {
		return &Error{Component: component, Field: field, Rule: "is invalid", kind: kind, cause: err}
	}
	return &Error{Component: component, Field: field + "." + e.Field, Value: e.Value, Rule: e.Rule, kind: kind,
		cause: e.cause, inner: err}
}

// Of sets e's Struct: the refusal is of a field of that struct, not of
// Config.
func (e *Error) Of(structName string) *Error {
	e.Struct = structName
	return e
}

func (e *Error) Error() string {
	return e.Component + ": " + e.structName() + "." + e.Field + " " + e.reason()
}

func (e *Error) structName() string {
	if e.Struct == "" {
		return "Config"
	}
	return e.Struct
}

// As lets errors.As find a *record.FieldError (Field "Config.CloseTimeout"
// say): the public face of a refusal, for the SDK's users, who cannot
// name this package.
func (e *Error) As(target any) bool {
	fe, ok := target.(**record.FieldError)
	if !ok {
		return false
	}
	*fe = &record.FieldError{Field: e.structName() + "." + e.Field, Reason: e.reason()}
	return true
}

// reason is the rule, the value and the cause.
func (e *Error) reason() string {
	s := e.Rule
	if e.Value != nil {
		switch v := e.Value.(type) {
		case string:
			s += fmt.Sprintf(", got %q", v)
		default:
			s += fmt.Sprintf(", got %v", v)
		}
	}
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	return s
}

// Unwrap is the component's sentinel, the cause and the nested refusal.
func (e *Error) Unwrap() []error {
	out := make([]error, 0, 3)
	for _, err := range []error{e.kind, e.cause, e.inner} {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}
