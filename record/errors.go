package record

import (
	"errors"
	"fmt"
)

// Sentinel errors that callers branch on.
var (
	// ErrInvalid is wrapped by every validation failure (see FieldError).
	ErrInvalid = errors.New("invalid")
	// ErrNotFound means no valid record exists for the instance.
	ErrNotFound = errors.New("instance not found")
	// ErrAlreadyExists means the instance id is alive under another
	// registration (another owner: the caller lacks its secret).
	ErrAlreadyExists = errors.New("instance already registered by another owner")
	// ErrJunk is wrapped by Decode when a value under the prefix is not a
	// valid record.
	ErrJunk = errors.New("junk record")
)

// FieldError is a validation failure of one field. Field uses the JSON
// (proto) names of docs/architecture.md: "service", "metadata", "check.timeout" for
// the rules of an instance; a dotted path from the request for bytes that
// do not decode ("instance.address", see Unmarshal). Reason quotes any
// value it shows, so the message is one line without control characters.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason) }

// Unwrap makes every FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
