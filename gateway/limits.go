package gateway

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pipestream/gateway/bridge"
)

// Error reasons of the built-in limits (ErrorInfo.reason).
const (
	ReasonRateLimited     = "RATE_LIMITED"
	ReasonTooManyUploads  = "TOO_MANY_UPLOADS"
	ReasonTooManyStreams  = "TOO_MANY_SUBSCRIBERS"
	ReasonTooManyResults  = "TOO_MANY_DOWNLOADS"
	ReasonUploadStalled   = "UPLOAD_STALLED"
	retryAfterMetadataKey = "retry-after"
)

// Methods the concurrency limits count.
const (
	watchMethod = "/pipestream.gateway.v1.DocumentService/WatchDocument"
)

// tenantLimits enforces the per-tenant limits of Config: a token-bucket
// request rate and caps on concurrent uploads and event streams. The tenant
// set is bounded by the configured tokens (one tenant without auth), so the
// maps need no eviction.
type tenantLimits struct {
	rate       rate.Limit // 0: unlimited
	burst      int
	maxUploads int // 0: unlimited
	maxSubs    int // 0: unlimited
	maxResults int // 0: unlimited

	mu       sync.Mutex
	limiters map[bridge.Tenant]*rate.Limiter
	uploads  map[bridge.Tenant]int
	subs     map[bridge.Tenant]int
	results  map[bridge.Tenant]int
}

func newTenantLimits(c *Config) *tenantLimits {
	l := &tenantLimits{
		burst:      c.RateBurst,
		maxUploads: c.MaxUploadsPerTenant,
		maxSubs:    c.MaxSubscribersPerTenant,
		maxResults: c.MaxDownloadsPerTenant,
		results:    map[bridge.Tenant]int{},
		limiters:   map[bridge.Tenant]*rate.Limiter{},
		uploads:    map[bridge.Tenant]int{},
		subs:       map[bridge.Tenant]int{},
	}
	if c.RateLimit > 0 {
		l.rate = rate.Limit(c.RateLimit)
	}
	return l
}

// allow takes one request from tenant's bucket, or returns
// ResourceExhausted with a RetryInfo saying when a token is available.
func (l *tenantLimits) allow(t bridge.Tenant) error {
	if l.rate == 0 {
		return nil
	}
	l.mu.Lock()
	lim := l.limiters[t]
	if lim == nil {
		lim = rate.NewLimiter(l.rate, l.burst)
		l.limiters[t] = lim
	}
	l.mu.Unlock()
	r := lim.Reserve()
	d := r.Delay()
	if d == 0 {
		return nil
	}
	r.Cancel() // give the token back: the call is refused, not delayed
	if d == rate.InfDuration {
		d = time.Second
	}
	return limitError(ReasonRateLimited, d, fmt.Sprintf(
		"rate limit exceeded for this tenant (%g requests/s, burst %d: --rate-limit, --rate-burst); retry after %s", float64(l.rate), l.burst, roundUp(d)))
}

// acquire counts one concurrent call of kind (uploads or event streams)
// for tenant; release must be called when it ends.
func (l *tenantLimits) acquire(fullMethod string, t bridge.Tenant) (release func(), err error) {
	var m map[bridge.Tenant]int
	var max int
	var reason, what, flag string
	switch fullMethod {
	case uploadMethod:
		m, max, reason, what, flag = l.uploads, l.maxUploads, ReasonTooManyUploads, "uploads", "--max-uploads-per-tenant"
	case subscribeMethod, watchMethod:
		m, max, reason, what, flag = l.subs, l.maxSubs, ReasonTooManyStreams, "event streams (subscribe, watch, WebSocket, operation waits)", "--max-subscribers-per-tenant"
	case resultMethod:
		m, max, reason, what, flag = l.results, l.maxResults, ReasonTooManyResults, "result downloads", "--max-downloads-per-tenant"
	default:
		return func() {}, nil
	}
	if max <= 0 {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if m[t] >= max {
		return nil, limitError(reason, time.Second, fmt.Sprintf(
			"too many concurrent %s for this tenant (limit %d, %s); retry when one ends", what, max, flag))
	}
	m[t]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			if m[t]--; m[t] <= 0 {
				delete(m, t)
			}
			l.mu.Unlock()
		})
	}, nil
}

// limitError is ResourceExhausted with ErrorInfo(reason) and
// RetryInfo(retry); the interceptor copies the delay into the retry-after
// trailer and the REST error handler into a Retry-After header.
func limitError(reason string, retry time.Duration, msg string) error {
	st := status.New(codes.ResourceExhausted, msg)
	if d, err := st.WithDetails(
		&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)},
	); err == nil {
		st = d
	}
	return st.Err()
}

// retryDelay returns the RetryInfo delay of a status error.
func retryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// retryAfterSeconds is the HTTP Retry-After value for d (whole seconds,
// rounded up, at least 1).
func retryAfterSeconds(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

func retryAfterMD(err error) metadata.MD {
	d, ok := retryDelay(err)
	if !ok {
		return nil
	}
	return metadata.Pairs(retryAfterMetadataKey, retryAfterSeconds(d))
}

func roundUp(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return time.Millisecond
	}
	return d.Round(time.Millisecond)
}
