package pinwebhook

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// fuzzMaxBody is the body limit under fuzzing: small, so that the fuzzer
// reaches it (the limit is a field of the Handler; MaxReviewBytes in use).
const fuzzMaxBody = 16 << 10

// imagePath is the only path a patch may touch.
var imagePath = regexp.MustCompile(`^/spec/template/spec/containers/(0|[1-9][0-9]*)/image$`)

// FuzzAdmissionReview feeds request bodies to the handler as the API server
// posts them (POST, application/json). Whatever the body: no panic (also
// none recovered and logged by Handle's fail-open), and the answer is 200
// or 400/413. A body that is not JSON, not an admission.k8s.io/v1
// AdmissionReview, without request or uid, or over the limit gets a 4xx
// with no AdmissionReview, so no patch. A 200 is an allowing v1
// AdmissionReview with the request's UID, and any patch in it is a JSON
// Patch that only replaces images of containers the object has, with the
// recorded digest. The seed corpus is in testdata/fuzz/FuzzAdmissionReview.
//
//	go test -run '^$' -fuzz '^FuzzAdmissionReview$' -fuzztime 20s ./internal/pinwebhook/
func FuzzAdmissionReview(f *testing.F) {
	cfg := testConfig()
	api := &cfg.Groups[0].Images[0]
	api.Targets = append(api.Targets, config.Target{Kind: workload.KindStatefulSet, Namespace: "tb", Name: "db", Container: "db"})
	var logs bytes.Buffer
	h := NewHandler(cfg, func(context.Context, config.Workload) (map[string]string, error) { return records, nil },
		func() bool { return true }, nil, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	h.maxBody = fuzzMaxBody

	f.Fuzz(func(t *testing.T, body []byte) {
		logs.Reset()
		r := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if strings.Contains(logs.String(), "panic") {
			t.Fatalf("the handler panicked (recovered and failed open): %s", logs.String())
		}
		got := w.Body.Bytes()
		uid, invalid := reviewCheck(body, fuzzMaxBody)
		typed := admissionv1.AdmissionReview{}
		typedErr := utiljson.Unmarshal(body, &typed)
		dup := hasDuplicateKeys(body)

		switch w.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			if (w.Code == http.StatusRequestEntityTooLarge) != (len(body) > fuzzMaxBody) {
				t.Fatalf("status %d for a body of %d bytes (limit %d)", w.Code, len(body), fuzzMaxBody)
			}
			if admissionAnswer(got) != nil || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
				t.Fatalf("a %d carries an admission answer: %q", w.Code, got)
			}
			if len(bytes.TrimSpace(got)) == 0 {
				t.Fatalf("a %d without a message", w.Code)
			}
			// The one reason to refuse a body that passes every check above:
			// a field of the wrong type (e.g. "dryRun": 5).
			if invalid == "" && !dup && typedErr == nil {
				t.Fatalf("a valid AdmissionReview got %d: %s", w.Code, got)
			}
		case http.StatusOK:
			if invalid != "" && !dup {
				t.Fatalf("answered 200 although %s: %.500s", invalid, got)
			}
			if typedErr != nil || typed.Request == nil {
				t.Fatalf("answered 200 to a body that does not decode as an AdmissionReview (%v)", typedErr)
			}
			var review admissionv1.AdmissionReview
			if err := json.Unmarshal(got, &review); err != nil || review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" || review.Response == nil {
				t.Fatalf("200 without a v1 AdmissionReview response (%v): %.500s", err, got)
			}
			resp := review.Response
			if !resp.Allowed {
				t.Fatalf("denied; the webhook always allows (B1 fails open): %.500s", got)
			}
			if resp.UID != typed.Request.UID || !dup && string(resp.UID) != uid {
				t.Fatalf("response UID %q, request UID %q", resp.UID, uid)
			}
			checkPatch(t, resp, typed.Request.Object.Raw, dup)
		default:
			t.Fatalf("status %d: %q", w.Code, got)
		}
	})
}

// reviewCheck returns the request's uid, or why the body must be refused,
// decided from a generic decoding (case-sensitive map keys) rather than by
// the handler's code.
func reviewCheck(body []byte, limit int) (uid, invalid string) {
	if len(body) > limit {
		return "", "the body is over the limit"
	}
	if !json.Valid(body) {
		return "", "the body is not JSON"
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return "", "the body does not decode: " + err.Error()
	}
	top, ok := v.(map[string]any)
	switch {
	case !ok:
		return "", "the body is not a JSON object"
	case top["apiVersion"] != "admission.k8s.io/v1" || top["kind"] != "AdmissionReview":
		return "", "the body is not an admission.k8s.io/v1 AdmissionReview"
	}
	req, ok := top["request"].(map[string]any)
	if !ok {
		return "", "the review has no request object"
	}
	if uid, _ = req["uid"].(string); uid == "" {
		return "", "the request has no uid"
	}
	return uid, ""
}

// checkPatch fails unless resp's patch is a JSON Patch that only replaces
// the image of containers the admitted object has, with a reference on the
// recorded digest (each container once). A body with duplicate keys is
// decoded by merging (encoding/json's rule), which a generic decoding does
// not reproduce, so there only the paths are checked; the API server sends
// objects it encoded itself, which have none.
func checkPatch(t *testing.T, resp *admissionv1.AdmissionResponse, object []byte, dup bool) {
	t.Helper()
	if len(resp.Patch) == 0 {
		if resp.PatchType != nil {
			t.Fatalf("patchType %s without a patch", *resp.PatchType)
		}
		return
	}
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch without patchType JSONPatch: %s", resp.Patch)
	}
	var ops []map[string]any
	if err := json.Unmarshal(resp.Patch, &ops); err != nil || len(ops) == 0 {
		t.Fatalf("the patch is not a JSON Patch (%v): %s", err, resp.Patch)
	}
	var containers []any
	if !dup {
		var obj map[string]any
		dec := json.NewDecoder(bytes.NewReader(object))
		dec.UseNumber() // 1e400 is a JSON number, not a float64
		if err := dec.Decode(&obj); err != nil {
			t.Fatalf("patched an object that is not a JSON object (%v): %s", err, resp.Patch)
		}
		containers, _ = dig(obj, "spec", "template", "spec", "containers").([]any)
	}
	seen := map[string]bool{}
	for _, op := range ops {
		path, _ := op["path"].(string)
		value, isString := op["value"].(string)
		m := imagePath.FindStringSubmatch(path)
		switch {
		case len(op) != 3 || op["op"] != "replace" || !isString:
			t.Fatalf("an operation that is not a replace of a string: %v", op)
		case m == nil:
			t.Fatalf("a patch of %q, which is not a container image", path)
		case seen[path]:
			t.Fatalf("%q patched twice", path)
		case !strings.HasSuffix(value, "@"+recorded):
			t.Fatalf("%q set to %q, not to the recorded digest", path, value)
		}
		seen[path] = true
		if dup {
			continue
		}
		i, _ := strconv.Atoi(m[1])
		if i >= len(containers) {
			t.Fatalf("%q: the object has %d containers", path, len(containers))
		}
		c, _ := containers[i].(map[string]any)
		if old, ok := c["image"].(string); !ok || old == value {
			t.Fatalf("%q replaces %v (%T) with %q; want a string image that changes", path, c["image"], c["image"], value)
		}
	}
}

// dig walks nested JSON objects.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// hasDuplicateKeys reports whether any JSON object in body repeats a key.
func hasDuplicateKeys(body []byte) bool {
	type object struct {
		keys map[string]bool
		key  bool // the next token is a key
	}
	var stack []*object // nil for an array
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1] != nil {
			stack[n-1].key = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &object{keys: map[string]bool{}, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, nil)
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
			continue
		}
		if s, ok := tok.(string); ok && len(stack) > 0 && stack[len(stack)-1] != nil && stack[len(stack)-1].key {
			top := stack[len(stack)-1]
			if top.keys[s] {
				return true
			}
			top.keys[s], top.key = true, false
			continue
		}
		valueDone()
	}
}
