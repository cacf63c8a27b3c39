package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/record"
)

// A receive deadline a quiet, healthy regnode would break (shorter than
// two progress intervals) is refused, naming the field; nothing starts.
func TestReceiveDeadlineValidated(t *testing.T) {
	c := newClient(t, "127.0.0.1:1")
	for _, d := range []time.Duration{-time.Second, time.Millisecond, client.MinReceiveDeadline - 1} {
		sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{ReceiveDeadline: d})
		if err == nil {
			sub.Close()
			t.Fatalf("ReceiveDeadline %s accepted", d)
		}
		if !errors.Is(err, record.ErrInvalid) || !strings.Contains(err.Error(), "ReceiveDeadline") {
			t.Fatalf("ReceiveDeadline %s: %v, want an invalid-field error naming it", d, err)
		}
	}
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{ReceiveDeadline: client.MinReceiveDeadline})
	if err != nil {
		t.Fatalf("ReceiveDeadline %s refused: %v", client.MinReceiveDeadline, err)
	}
	sub.Close()
}
