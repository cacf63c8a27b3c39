package client

import (
	"errors"
	"fmt"

	"github.com/regcluster/registry/record"
)

// The SDK's sentinel errors, for errors.Is. Errors of the regnode's API
// match record's (record.ErrInvalid, record.ErrNotFound,
// record.ErrAlreadyExists) through FromStatus.
var (
	// ErrClosed is returned by a Client's calls once its Close began, and by
	// a Registration's after its Close: nothing was started or sent.
	ErrClosed = errors.New("registry client closed")

	// ErrStalled is the error of a stream that delivered nothing within the
	// receive deadline; the subscription has moved on from it.
	ErrStalled = errors.New("regnode sent nothing within the receive deadline")

	// ErrInsecureToken is a Config.Token that would be sent in plaintext to
	// a regnode off this host: refused by New unless Config.AllowInsecureToken.
	ErrInsecureToken = errors.New("a token would cross the network in plaintext")

	// ErrDiskCache is wrapped by the reasons a disk view is ignored (logged,
	// never returned to callers: the subscription goes on without it).
	ErrDiskCache = errors.New("disk cache unusable")

	// ErrInvalidConfig is wrapped by every error of Config.Validate,
	// SubscribeOptions.Validate and RegisterOptions.Validate, and so of New,
	// Subscribe and Register: a setting that cannot work, refused before
	// anything starts. It wraps record.ErrInvalid (the SDK's "invalid input"),
	// and errors.As finds a *record.FieldError naming the field
	// ("Config.CloseTimeout", "SubscribeOptions.ReceiveDeadline").
	ErrInvalidConfig = fmt.Errorf("client: invalid config: %w", record.ErrInvalid)
)
