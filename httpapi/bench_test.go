package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// BenchmarkRegisterToSSE measures what the dashboard waits for: from a
// Register call's start to the SSE put of that instance on an open
// /api/v1/watch of a real regnode (etcd write, etcd watch, fan-out, gRPC
// Watch, SSE). One registration at a time; p50 and p99 reported.
//
//	go test -run '^$' -bench RegisterToSSE -benchtime 200x ./httpapi/
func BenchmarkRegisterToSSE(b *testing.B) {
	rn := regnodetest.Start(b)
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	rpc := registryv1.NewRegistryClient(cc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+rn.Node.MetricsAddr()+"/api/v1/watch?service=bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("watch: %v %v", resp, err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	// untilPut reads events until the put of id.
	untilPut := func(id string) {
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				b.Fatalf("read SSE: %v", err)
			}
			data, ok := strings.CutPrefix(strings.TrimSuffix(l, "\n"), "data: ")
			if !ok {
				continue
			}
			var line render.WatchLine
			if err := json.Unmarshal([]byte(data), &line); err != nil {
				b.Fatalf("SSE data %q: %v", data, err)
			}
			if line.Type == render.WatchPut && line.Instance.ID == id {
				return
			}
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprintf("b-%d", i)
		t0 := time.Now()
		if _, err := rpc.Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour), Instance: &registryv1.Instance{
			Service: "bench", Id: id, Address: fmt.Sprintf("127.0.0.1:%d", 10000+i%50000)}}); err != nil {
			b.Fatal(err)
		}
		untilPut(id)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
