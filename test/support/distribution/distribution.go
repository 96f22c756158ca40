// Package distribution starts the CNCF Distribution registry (Debian's
// docker-registry package, installed by hack/install-distribution.sh) as a
// process on loopback, over TLS with a fresh self-signed certificate and
// htpasswd basic auth, so that tests prove the registry paths of
// image-refresh (R1 resolve, TLS via caFile, basic auth from pull secrets,
// R20) against a registry implementation we did not pick the code of.
//
// Each registry has its own temporary directory: config.yml, the
// certificate and key, the htpasswd file, the storage root and the log.
package distribution

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/content"
	"github.com/image-refresh/image-refresh/test/support/freeport"
	"github.com/image-refresh/image-refresh/test/support/testcert"
)

// DefaultBin is where Debian's docker-registry package puts the registry.
const DefaultBin = "/usr/bin/docker-registry"

// The credentials every registry started here accepts (htpasswd, bcrypt).
// They are test credentials: tests grep every output of image-refresh for
// Password to prove it never leaks (R20).
const (
	User     = "image-refresh-robot"
	Password = "Dstrb-s3cr3t-9f4c2e7a1b"
	// passwordHash is bcrypt(Password), cost 4: Distribution's htpasswd
	// backend accepts bcrypt only, and the standard library has no bcrypt.
	passwordHash = "$2a$04$Yi.rvhY4ZHMKti3vpi9WzOg7LUd3aIu9OKmffAQkgQ6sjg40keRA2"
)

// Options configures a registry.
type Options struct {
	// Bin is the registry binary; default $DISTRIBUTION_BIN, else DefaultBin.
	Bin string
	// Dir receives config, certificates, storage and the log; required.
	Dir string
	// TokenAuth replaces htpasswd with Distribution's auth.token and an
	// in-process token server (TokenServer) that takes the same credentials.
	TokenAuth bool
	// Notify, if set, is the registry's one notifications endpoint: it
	// sends the events of manifest pushes there.
	Notify *Endpoint
}

// Endpoint is a notifications endpoint of the registry's config.
type Endpoint struct {
	URL           string // e.g. "http://127.0.0.1:PORT/distribution"
	Authorization string // the Authorization header it sends, e.g. "Bearer …"
}

// Registry is a running Distribution registry.
type Registry struct {
	content.Store // Push, PushRandomIndex, DeleteManifest, Head, …

	Host     string // "127.0.0.1:PORT"
	CAPEM    []byte // the self-signed serving certificate, which is its own CA
	CAFile   string // CAPEM on disk, for a config's registries[].caFile
	User     string
	Password string
	Dir      string
	LogFile  string
	// Token is the token server when Options.TokenAuth is set, else nil.
	Token *TokenServer

	pair   testcert.Pair // the serving certificate and key
	fronts []*Front
	cmd    *exec.Cmd
	exited chan struct{}
}

// BinPath returns the registry binary Start would run.
func BinPath(opts Options) string {
	if opts.Bin != "" {
		return opts.Bin
	}
	if b := os.Getenv("DISTRIBUTION_BIN"); b != "" {
		return b
	}
	return DefaultBin
}

// Start writes the registry's files into opts.Dir, starts it on a free
// loopback port and returns once it answers /v2/ over TLS (with 401, since
// auth is on). Stop it with Stop.
func Start(ctx context.Context, opts Options) (*Registry, error) {
	bin := BinPath(opts)
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		return nil, fmt.Errorf("distribution: registry binary %s not found; install it with hack/install-distribution.sh (Debian package docker-registry) or set DISTRIBUTION_BIN", bin)
	}
	if opts.Dir == "" {
		return nil, errors.New("distribution: Options.Dir is required")
	}
	if err := os.MkdirAll(filepath.Join(opts.Dir, "storage"), 0o700); err != nil {
		return nil, fmt.Errorf("distribution: %w", err)
	}
	r := &Registry{User: User, Password: Password, Dir: opts.Dir, LogFile: filepath.Join(opts.Dir, "registry.log")}
	r.Store = newContent(r)
	certFile, keyFile := filepath.Join(opts.Dir, "tls.crt"), filepath.Join(opts.Dir, "tls.key")
	pair, err := writeSelfSigned(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("distribution: %w", err)
	}
	r.CAPEM, r.pair = pair.CertPEM, pair
	auth := fmt.Sprintf("  htpasswd:\n    realm: image-refresh-test\n    path: %s\n", filepath.Join(opts.Dir, "htpasswd"))
	if opts.TokenAuth {
		if r.Token, err = startTokenServer(pair); err != nil {
			return nil, fmt.Errorf("distribution: %w", err)
		}
		auth = fmt.Sprintf("  token:\n    realm: %s\n    service: %s\n    issuer: %s\n    rootcertbundle: %s\n",
			r.Token.Realm, tokenService, tokenIssuer, certFile)
	}
	r.CAFile = filepath.Join(opts.Dir, "ca.pem")
	if err := os.WriteFile(r.CAFile, r.CAPEM, 0o644); err != nil {
		return nil, fmt.Errorf("distribution: %w", err)
	}
	htpasswd := filepath.Join(opts.Dir, "htpasswd")
	if err := os.WriteFile(htpasswd, []byte(User+":"+passwordHash+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("distribution: %w", err)
	}
	// A port picked by the kernel can be taken again before the registry
	// binds it; try a few.
	var last error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("distribution: %w", err)
		}
		r.Host = fmt.Sprintf("127.0.0.1:%d", port)
		cfg := filepath.Join(opts.Dir, "config.yml")
		text := config(r.Host, filepath.Join(opts.Dir, "storage"), certFile, keyFile, auth) + notifications(opts.Notify)
		if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
			return nil, fmt.Errorf("distribution: %w", err)
		}
		if last = r.start(ctx, bin, cfg); last == nil {
			return r, nil
		}
		_ = r.stopRegistry()
	}
	r.Token.close()
	return nil, last
}

// config is the registry's config.yml: loopback only, TLS, the auth section
// (htpasswd or token), and manifest deletion on (tests delete a tag by
// deleting its manifest).
func config(addr, storage, cert, key, auth string) string {
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	return fmt.Sprintf(`version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %s
  secret: %s
  tls:
    certificate: %s
    key: %s
  headers:
    X-Content-Type-Options: [nosniff]
auth:
%s`, storage, addr, hex.EncodeToString(secret), cert, key, auth)
}

// notifications is the config's notifications section for e (none for
// nil): manifest events only (blob events are ignored by media type), a
// short timeout, and a quick retry, as a test wants.
func notifications(e *Endpoint) string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf(`notifications:
  endpoints:
    - name: image-refresh
      url: %s
      headers:
        Authorization: [%q]
      timeout: 2s
      threshold: 3
      backoff: 100ms
      ignoredmediatypes:
        - application/octet-stream
`, e.URL, e.Authorization)
}

func (r *Registry) start(ctx context.Context, bin, cfg string) error {
	logFile, err := os.OpenFile(r.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("distribution: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "serve", cfg)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = r.Dir
	// Its own process group, and SIGKILL when the test binary dies, so an
	// interrupted test leaves no registry behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("distribution: start %s: %w", bin, err)
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(r.exited) }()
	return r.waitReady(ctx, 30*time.Second)
}

// waitReady polls GET /v2/ over TLS until the registry answers 401 (auth
// required) or 200.
func (r *Registry) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Transport: r.Transport(), Timeout: 2 * time.Second}
	var last error
	for {
		select {
		case <-r.exited:
			return fmt.Errorf("distribution: the registry exited at start; log:\n%s", r.tail(20))
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+r.Host+"/v2/", nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /v2/ answered %d", resp.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("distribution: not ready on %s after %s: %v; log:\n%s", r.Host, timeout, last, r.tail(20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Transport trusts the registry's certificate (and nothing else).
func (r *Registry) Transport() *http.Transport {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.CAPEM)
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return t
}

// Stop stops the registry (SIGTERM, then SIGKILL after 5 s) and its token
// server.
func (r *Registry) Stop() error {
	r.Token.close()
	for _, f := range r.fronts {
		_ = f.srv.Close()
	}
	return r.stopRegistry()
}

func (r *Registry) stopRegistry() error {
	if r.cmd == nil || r.cmd.Process == nil {
		return nil
	}
	select {
	case <-r.exited:
		return nil
	default:
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-r.exited:
		return nil
	case <-time.After(5 * time.Second):
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-r.exited:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("distribution: registry pid %d still running after SIGKILL", r.cmd.Process.Pid)
	}
}

// Log returns the registry's log so far (access log included).
func (r *Registry) Log() string {
	b, _ := os.ReadFile(r.LogFile)
	return string(b)
}

func (r *Registry) tail(n int) string {
	lines := strings.Split(strings.TrimRight(r.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// StartT starts a registry in a temporary directory of t and stops it when
// the test ends. A missing binary fails the test with the install command.
// notify, if given, is the registry's notifications endpoint.
func StartT(t testing.TB, notify ...*Endpoint) *Registry {
	t.Helper()
	var opts Options
	if len(notify) > 0 {
		opts.Notify = notify[0]
	}
	return StartWithT(t, opts)
}

// StartWithT is StartT with options; opts.Dir defaults to a temporary
// directory of t.
func StartWithT(t testing.TB, opts Options) *Registry {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	r, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("distribution registry log (%s), last lines:\n%s", r.LogFile, r.tail(40))
		}
	})
	return r
}

func freePort() (int, error) {
	return freeport.Port()
}

// writeSelfSigned writes a loopback certificate (its own CA) and its key,
// and returns the CA PEM a client must trust.
func writeSelfSigned(certFile, keyFile string) (testcert.Pair, error) {
	p, err := testcert.Loopback("distribution-test")
	if err != nil {
		return testcert.Pair{}, err
	}
	if err := os.WriteFile(certFile, p.CertPEM, 0o644); err != nil {
		return testcert.Pair{}, err
	}
	if err := os.WriteFile(keyFile, p.KeyPEM, 0o600); err != nil {
		return testcert.Pair{}, err
	}
	return p, nil
}
