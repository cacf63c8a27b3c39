// Package configtest runs the table tests of a component's Config.Validate:
// each case changes one field of a valid Config and says whether Validate
// accepts it or which field it must name in its refusal.
package configtest

import (
	"errors"
	"testing"

	"github.com/regcluster/registry/internal/configerr"
)

// Case is one change to a valid Config.
type Case[C any] struct {
	// Name describes the change ("PageSize -1").
	Name string
	// Set changes the Config.
	Set func(*C)
	// Refused is the field Validate must name (configerr.Error.Field);
	// "" means Validate must accept the change.
	Refused string
}

// Run checks each case against validate, starting from base() each time.
// A refusal must be a *configerr.Error naming the field and wrapping
// sentinel.
func Run[C any](t *testing.T, base func() C, validate func(C) error, sentinel error, cases []Case[C]) {
	t.Helper()
	if err := validate(base()); err != nil {
		t.Fatalf("the base Config is refused: %v", err)
	}
	for _, tc := range cases {
		c := base()
		tc.Set(&c)
		err := validate(c)
		if tc.Refused == "" {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.Name, err)
			}
			continue
		}
		var e *configerr.Error
		switch {
		case err == nil:
			t.Errorf("%s: accepted, want %s refused", tc.Name, tc.Refused)
		case !errors.As(err, &e) || !errors.Is(err, sentinel):
			t.Errorf("%s: %v (%T) is not a *configerr.Error wrapping %v", tc.Name, err, err, sentinel)
		case e.Field != tc.Refused:
			t.Errorf("%s: refused %s (%v), want %s", tc.Name, e.Field, err, tc.Refused)
		}
	}
}

// Accepts is a case Validate must accept.
func Accepts[C any](name string, set func(*C)) Case[C] { return Case[C]{Name: name, Set: set} }

// Refuses is a case Validate must refuse, naming field.
func Refuses[C any](name, field string, set func(*C)) Case[C] {
	return Case[C]{Name: name, Set: set, Refused: field}
}
