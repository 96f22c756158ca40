package testregistry

import (
	"context"
	"net/http"
	"net/http/httptest"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-refresh/image-refresh/test/support/content"
)

// The content helpers (content.Store, embedded in Server: Push,
// PushRandomImage, PushRandomIndex, Tag, DeleteTag, Head, … and their Must
// forms) talk to the registry in-process, past the middleware: they work
// before Start and under TLS or basic auth, are not counted in Requests,
// and are not hit by faults.

// contentHost names the registry in references the content helpers build; the
// in-process transport ignores it.
const contentHost = "testregistry.invalid"

// newContent is the content API of s, in-process.
func newContent(s *Server) content.Store {
	return content.New("testregistry", func() string { return contentHost }, true,
		func(ctx context.Context) []remote.Option {
			return []remote.Option{remote.WithContext(ctx), remote.WithTransport(inProcess{s.registry})}
		})
}

// inProcess is a RoundTripper that answers from the handler directly.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	// Give the handler what a server-side request always has.
	in := req.Clone(req.Context())
	if in.Body == nil {
		in.Body = http.NoBody
	}
	in.RequestURI = req.URL.RequestURI()
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, in)
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}
