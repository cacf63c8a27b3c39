package server

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

// pageToken is what a next_page_token carries: the listing's revision and
// epoch, the last key read, and the service listed (a token is good only
// for the listing it came from). Opaque to clients: base64url of JSON.
type pageToken struct {
	Revision int64  `json:"r"`
	Epoch    string `json:"e,omitempty"`
	Key      string `json:"k"`
	Service  string `json:"s,omitempty"`
}

func encodePageToken(c store.Cursor, service string) string {
	b, _ := json.Marshal(pageToken{Revision: c.Revision, Epoch: c.Epoch, Key: c.Key, Service: service}) // plain fields: never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(s, service string) (store.Cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	var t pageToken
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	switch {
	case err != nil:
		return store.Cursor{}, &record.FieldError{Field: "page_token", Reason: fmt.Sprintf("not a token of this server: %v", err)}
	case t.Revision <= 0 || t.Key == "":
		return store.Cursor{}, &record.FieldError{Field: "page_token", Reason: "not a token of this server: no revision or key"}
	case t.Service != service:
		return store.Cursor{}, &record.FieldError{Field: "page_token", Reason: fmt.Sprintf("was issued for service %q, not %q", t.Service, service)}
	}
	return store.Cursor{Revision: t.Revision, Epoch: t.Epoch, Key: t.Key}, nil
}
