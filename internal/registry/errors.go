package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// ErrorKind says why a registry call failed, in words a log line, an event
// and a metric label can share (R15).
type ErrorKind string

const (
	KindTimeout       ErrorKind = "timeout"        // the call outlived Options.Timeout (R14)
	KindUnauthorized  ErrorKind = "unauthorized"   // 401 or 403: credentials missing or wrong
	KindNotFound      ErrorKind = "not-found"      // 404: no such repository, tag or digest
	KindRateLimited   ErrorKind = "rate-limited"   // 429; RetryAfter says when to come back (C2)
	KindServerError   ErrorKind = "server-error"   // 5xx
	KindInvalidDigest ErrorKind = "invalid-digest" // the answer carried no usable digest (R1)
	// KindInconsistent: the HEAD of a tag named one digest, the GET of the
	// same tag served content with another (R1: never pinned).
	KindInconsistent ErrorKind = "inconsistent-digest"
	KindNetwork      ErrorKind = "network" // connection refused, reset, DNS
	KindTLS          ErrorKind = "tls"     // certificate not trusted, or not TLS at all
	KindOther        ErrorKind = "other"
)

// Error is a failed registry call, classified. Its text never holds
// credentials (R20): it is built from go-containerregistry errors, which
// redact URLs and never include request headers.
type Error struct {
	Ref        string // the reference asked for, "repo:tag" or "repo@digest"
	Kind       ErrorKind
	Status     int           // HTTP status of the failing answer; 0 when there was none
	RetryAfter time.Duration // from Retry-After on 429/503; 0 when absent
	Err        error
}

func (e *Error) Error() string {
	s := e.Ref + ": " + string(e.Kind)
	switch {
	case e.Status != 0 && e.RetryAfter > 0:
		s += fmt.Sprintf(" (HTTP %d, retry after %s)", e.Status, e.RetryAfter)
	case e.Status != 0:
		s += fmt.Sprintf(" (HTTP %d)", e.Status)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// RetryAfterDelay is RetryAfter, for callers that stay out of this package
// (the poller backs off by it).
func (e *Error) RetryAfterDelay() time.Duration { return e.RetryAfter }

// Classify returns err as an *Error: the one in its chain, or a new one with
// the kind read from the error. It returns nil for nil.
func Classify(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	e = &Error{Kind: kindOf(err), Err: err}
	var te *transport.Error
	if errors.As(err, &te) {
		e.Status = te.StatusCode
	}
	return e
}

// kindOf orders the checks so that the cause wins over its side effects: for
// a loopback host go-containerregistry pings https and http together, so one
// error can hold both a TLS failure and an HTTP status.
func kindOf(err error) ErrorKind {
	if isTimeout(err) {
		return KindTimeout
	}
	// The server spoke TLS and we did not trust it.
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
	)
	if errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid) || errors.As(err, &verify) {
		return KindTLS
	}
	var te *transport.Error
	if errors.As(err, &te) {
		return kindOfStatus(te.StatusCode)
	}
	// The server does not speak TLS, or refused the handshake.
	var (
		record tls.RecordHeaderError
		alert  tls.AlertError
	)
	if errors.As(err, &record) || errors.As(err, &alert) {
		return KindTLS
	}
	var (
		op  *net.OpError
		dns *net.DNSError
	)
	if errors.As(err, &op) || errors.As(err, &dns) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return KindNetwork
	}
	return KindOther
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func kindOfStatus(status int) ErrorKind {
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return KindUnauthorized
	case status == http.StatusNotFound:
		return KindNotFound
	case status == http.StatusTooManyRequests:
		return KindRateLimited
	case status >= 500:
		return KindServerError
	}
	return KindOther
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs < 0 {
			return 0
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
