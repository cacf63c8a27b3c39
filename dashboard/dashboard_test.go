package dashboard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/regcluster/registry/dashboard"
)

func get(t *testing.T, h http.Handler, method, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Result(), string(b)
}

// The page and its assets come from the binary, locked to their own
// origin by CSP; the read-only mode and the token field (with auth) reach
// the page.
func TestServesEmbeddedAssets(t *testing.T) {
	for _, ro := range []bool{false, true} {
		h, err := dashboard.New(dashboard.Config{ReadOnly: ro, Auth: !ro})
		if err != nil {
			t.Fatal(err)
		}
		resp, body := get(t, h, "GET", "/")
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
			!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Fatalf("GET / = %d %v", resp.StatusCode, resp.Header)
		}
		want := `<meta name="registry-read-only" content="false">`
		if ro {
			want = `<meta name="registry-read-only" content="true">`
		}
		if !strings.Contains(body, want) || strings.Contains(body, `id="readonly"`) != ro {
			t.Errorf("read-only %v: page lacks %s or has the wrong banner", ro, want)
		}
		if strings.Contains(body, `<meta name="registry-auth" content="true">`) != !ro || strings.Contains(body, `id="token"`) != !ro {
			t.Errorf("auth %v: the page's token field or its meta is wrong", !ro)
		}
		if strings.Contains(body, "http://") || strings.Contains(body, "https://") {
			t.Errorf("the page refers to another origin")
		}
		for _, a := range []string{"/assets/app.js", "/assets/style.css"} {
			if resp, body := get(t, h, "GET", a); resp.StatusCode != 200 || len(body) < 100 {
				t.Errorf("GET %s = %d (%d bytes)", a, resp.StatusCode, len(body))
			}
		}
		for _, p := range []string{"/nothing", "/assets/", "/assets/index.html", "/assets/../dashboard.go"} {
			if resp, _ := get(t, h, "GET", p); resp.StatusCode != 404 && resp.StatusCode != 301 {
				t.Errorf("GET %s = %d, want 404", p, resp.StatusCode)
			}
		}
		if resp, _ := get(t, h, "POST", "/"); resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST / = %d, want 405", resp.StatusCode)
		}
	}
}
