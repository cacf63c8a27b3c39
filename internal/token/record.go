package token

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/regcluster/registry/record"
)

// Role is what a token may do within its scope. Each role includes the
// ones below it, except that register and operate are siblings: both
// read, register writes its own instances, operate acts on anyone's.
type Role string

// The roles.
const (
	Read     Role = "read"
	Register Role = "register"
	Operate  Role = "operate"
	Admin    Role = "admin"
)

// ParseRole returns the role named s.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case Read, Register, Operate, Admin:
		return r, nil
	}
	return "", fmt.Errorf("role %q must be read, register, operate or admin", s)
}

// ScopeKind says what a Scope's Value is.
type ScopeKind string

// The scope kinds.
const (
	ScopeService ScopeKind = "service" // Value is one service
	ScopePrefix  ScopeKind = "prefix"  // every service starting with Value
	ScopeAll     ScopeKind = "all"     // every service; Value is empty
)

// Scope is the services a token's role applies to.
type Scope struct {
	Kind  ScopeKind `json:"kind"`
	Value string    `json:"value,omitempty"`
}

// String is the scope as regctl prints it: service:web, prefix:web-, all.
func (s Scope) String() string {
	if s.Kind == ScopeAll {
		return "all"
	}
	return string(s.Kind) + ":" + s.Value
}

// Covers reports whether service is in the scope; "" (every service) is
// covered by ScopeAll only.
func (s Scope) Covers(service string) bool {
	switch s.Kind {
	case ScopeAll:
		return true
	case ScopeService:
		return service != "" && service == s.Value
	case ScopePrefix:
		return service != "" && strings.HasPrefix(service, s.Value)
	}
	return false
}

// Validate reports why s cannot be a scope, naming the field.
func (s Scope) Validate() error {
	switch s.Kind {
	case ScopeAll:
		if s.Value != "" {
			return &record.FieldError{Field: "scope.value", Reason: "must be empty for scope all"}
		}
	case ScopeService:
		if err := record.ValidService(s.Value); err != nil {
			return &record.FieldError{Field: "scope.value", Reason: err.Error()}
		}
	case ScopePrefix:
		// A prefix of a valid name: the name's characters, not empty.
		if s.Value == "" || len(s.Value) > record.MaxServiceLen {
			return &record.FieldError{Field: "scope.value", Reason: fmt.Sprintf("a prefix of 1..%d characters", record.MaxServiceLen)}
		}
		for i := 0; i < len(s.Value); i++ {
			c := s.Value[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
				return &record.FieldError{Field: "scope.value", Reason: fmt.Sprintf("prefix %q: only lowercase letters, digits, '-' and '.' are allowed", s.Value)}
			}
		}
	default:
		return &record.FieldError{Field: "scope.kind", Reason: fmt.Sprintf("%q must be service, prefix or all", s.Kind)}
	}
	return nil
}

// MaxNameLen is the longest token name.
const MaxNameLen = 64

// ValidName reports why name cannot name a token: 1..64 of [a-z0-9._-],
// starting with a letter or digit. Names show in logs and metrics; they
// are never secret.
func ValidName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return &record.FieldError{Field: "name", Reason: fmt.Sprintf("%d characters, want 1..%d", len(name), MaxNameLen)}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return &record.FieldError{Field: "name", Reason: fmt.Sprintf("%q: only lowercase letters, digits, '.', '_' and '-' are allowed", name)}
		}
	}
	if !(name[0] >= 'a' && name[0] <= 'z' || name[0] >= '0' && name[0] <= '9') {
		return &record.FieldError{Field: "name", Reason: fmt.Sprintf("%q must start with a letter or digit", name)}
	}
	return nil
}

// Record is a token as etcd keeps it (JSON under Key): everything but
// the secret, of which only Hash is kept.
type Record struct {
	Name      string    `json:"name"`
	Role      Role      `json:"role"`
	Scope     Scope     `json:"scope"`
	Created   time.Time `json:"created"`
	Expires   time.Time `json:"expires,omitzero"` // zero: never
	Hash      string    `json:"hash"`
	CreatedBy string    `json:"created_by,omitempty"` // the token (or regnode) that made it
}

// Expired reports whether r has expired at now.
func (r *Record) Expired(now time.Time) bool {
	return !r.Expires.IsZero() && !now.Before(r.Expires)
}

// Validate reports the first field of r that cannot be.
func (r *Record) Validate() error {
	if err := ValidName(r.Name); err != nil {
		return err
	}
	if _, err := ParseRole(string(r.Role)); err != nil {
		return &record.FieldError{Field: "role", Reason: err.Error()}
	}
	if err := r.Scope.Validate(); err != nil {
		return err
	}
	if !strings.HasPrefix(r.Hash, "sha256:") || len(r.Hash) != len("sha256:")+64 {
		return &record.FieldError{Field: "hash", Reason: "not a sha256: hash"}
	}
	return nil
}

// Encode is r's stored form.
func Encode(r *Record) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// Decode reads a stored record, refusing any that does not validate (it
// then grants nothing).
func Decode(b []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrJunk, err)
	}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrJunk, err)
	}
	return &r, nil
}

// Keys of the auth records.
func tokensPrefix(prefix string) string { return prefix + "auth/tokens/" }

// Key is where the record of the token named name is kept.
func Key(prefix, name string) string { return tokensPrefix(prefix) + name }

// BootstrapKey marks that a regnode made the first admin token.
func BootstrapKey(prefix string) string { return prefix + "auth/bootstrap" }
