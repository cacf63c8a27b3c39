package client

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/record"
)

// fieldError rebuilds the *record.FieldError a regnode sent as the first
// errdetails.BadRequest violation of st, or returns nil when st names no
// field.
func fieldError(st *status.Status) *record.FieldError {
	for _, d := range st.Details() {
		br, ok := d.(*errdetails.BadRequest)
		if !ok {
			continue
		}
		for _, v := range br.GetFieldViolations() {
			if v.GetField() != "" {
				return &record.FieldError{Field: v.GetField(), Reason: v.GetDescription()}
			}
		}
	}
	return nil
}

// As lets errors.As find the field of an InvalidArgument that named one.
func (e *statusError) As(target any) bool {
	fe, ok := target.(**record.FieldError)
	if !ok || e.field == nil {
		return false
	}
	*fe = e.field
	return true
}
