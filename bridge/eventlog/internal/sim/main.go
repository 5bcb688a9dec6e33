// Command sim compares event-log retention policies on a synthetic client
// population, driving the production retention engine
// (bridge/eventlog/internal/retention: tracker, index, policy) with a
// simulated clock. Nothing of the policy is reimplemented here: the adaptive
// policy is eventlog.Options{}'s defaults, the baselines are the same engine
// with client tracking off and caps set.
//
//	go run ./bridge/eventlog/internal/sim -days 30 -seed 1
//
// Every simulated minute: events are appended (Poisson, diurnal rate, sizes
// 150-650 bytes), clients whose visit is due connect with their cursor (the
// last seq they processed), read to the head and leave, and each policy runs
// one retention pass (eventlog's default PruneInterval). A visit whose cursor
// is below the policy's oldest retained seq is a snapshot fallback (#info
// OutdatedCursor).
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/eventlog/internal/retention"
)

type client struct {
	key     string
	class   string
	cursor  uint64    // last seq processed (0 before the first visit)
	nextAt  time.Time // next visit
	lastAt  time.Time // last visit
	visits  int
	absence func(r *rand.Rand) time.Duration
}

type policy struct {
	name      string
	r         *retention.Retainer
	sumBytes  float64 // byte-minutes, for the time average
	peakBytes uint64
	fallbacks map[string]int
	visits    int
	short     int // fallbacks of clients away less than the floor
}

// params are the simulation's inputs (the flags).
type params struct {
	days                          int
	seed                          uint64
	rate, snapMB                  float64
	pollers, bursty, absent, live int
}

func main() {
	var p params
	flag.IntVar(&p.days, "days", 30, "simulated days")
	flag.Uint64Var(&p.seed, "seed", 1, "random seed")
	flag.Float64Var(&p.rate, "rate", 20, "mean events per minute")
	flag.Float64Var(&p.snapMB, "snapshot-mb", 40, "size of a full snapshot in MB")
	flag.IntVar(&p.pollers, "pollers", 200, "regular pollers (every 10 min +- 2)")
	flag.IntVar(&p.bursty, "bursty", 50, "bursty clients (online bursts, absences exp. mean 6 h, max 2 days)")
	flag.IntVar(&p.absent, "absent", 20, "long-absent clients (away 3-14 days)")
	flag.IntVar(&p.live, "live", 10, "always-connected subscribers")
	flag.Parse()
	r, err := simulate(p)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	r.print(p)
}

// result is one simulation's outcome.
type result struct {
	policies []*policy // cost model, draft rules, 72 h, count, size only
	events   uint64
	steps    int
	floor    time.Duration
}

// simulate runs every policy over the same generated workload.
func simulate(in params) (*result, error) {
	rng := rand.New(rand.NewPCG(in.seed, in.seed^0x9e3779b97f4a7c15))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	snapshot := uint64(in.snapMB * (1 << 20))

	costModel, tcfg, err := eventlog.Options{}.RetentionConfig()
	if err != nil {
		return nil, err
	}
	draft, _, err := eventlog.Options{DisableCostModel: true}.RetentionConfig()
	if err != nil {
		return nil, err
	}
	draft.MinBytes = 0 // as before the floor: the snapshot cap won over MinAge
	floor := costModel.MinAge
	mk := func(name string, cfg retention.Config) *policy {
		return &policy{name: name, r: retention.NewRetainer(cfg, tcfg, start, nil, nil), fallbacks: map[string]int{}}
	}
	policies := []*policy{
		mk("cost model (this log, defaults)", costModel),
		mk("adaptive, draft rules (before the cost model)", draft),
		mk("time: 72 h (AT relays)", retention.Config{MaxAge: 72 * time.Hour}),
		mk("count: newest 50 and <= 2 h (RRDP servers)", retention.Config{SnapshotCap: true, MaxEvents: 50, MaxAge: 2 * time.Hour}),
		mk("size only (RFC 8182)", retention.Config{SnapshotCap: true}),
	}

	var clients []*client
	add := func(n int, class string, first func() time.Duration, absence func(*rand.Rand) time.Duration) {
		for i := range n {
			clients = append(clients, &client{key: fmt.Sprintf("%s-%d", class, i), class: class,
				nextAt: start.Add(first()), absence: absence})
		}
	}
	add(in.pollers, "poller", func() time.Duration { return time.Duration(rng.IntN(10)) * time.Minute },
		func(r *rand.Rand) time.Duration { return time.Duration(8+r.IntN(5)) * time.Minute })
	add(in.bursty, "bursty", func() time.Duration { return time.Duration(rng.IntN(600)) * time.Minute },
		func(r *rand.Rand) time.Duration {
			if r.IntN(4) > 0 { // within a burst: back in a few minutes
				return time.Duration(1+r.IntN(5)) * time.Minute
			}
			return min(time.Duration(r.ExpFloat64()*float64(6*time.Hour)), 48*time.Hour)
		})
	add(in.absent, "absent", func() time.Duration { return time.Duration(rng.IntN(14*24*60)) * time.Minute },
		func(r *rand.Rand) time.Duration { return time.Duration(3*24*60+r.IntN(11*24*60)) * time.Minute })

	var seq uint64
	var liveClients [][]*retention.Client // per policy
	for _, p := range policies {
		var cs []*retention.Client
		for i := range in.live {
			cs = append(cs, p.r.Touch(fmt.Sprintf("live-%d", i), nil, start))
		}
		liveClients = append(liveClients, cs)
	}
	steps := in.days * 24 * 60
	for step := range steps {
		now := start.Add(time.Duration(step) * time.Minute)
		// Diurnal rate: 0.4x at night to 1.6x at midday.
		hour := float64(now.Hour()) + float64(now.Minute())/60
		lambda := in.rate * (1 + 0.6*math.Sin((hour-6)/24*2*math.Pi))
		for range poisson(rng, lambda) {
			seq++
			size := 150 + rng.IntN(500)
			for _, p := range policies {
				p.r.Appended(seq, now, size)
			}
		}
		for i := range policies {
			for _, c := range liveClients[i] {
				c.Deliver(seq)
			}
		}
		for _, c := range clients {
			if now.Before(c.nextAt) {
				continue
			}
			for _, p := range policies {
				p.visits++
				oldest, _, _, _ := p.r.Window()
				if c.visits > 0 && c.cursor < oldest {
					p.fallbacks[c.class]++
					if now.Sub(c.lastAt) < floor {
						p.short++
					}
				}
				cur := c.cursor
				tc := p.r.Touch(c.key, &cur, now)
				tc.Deliver(seq) // reads to the head (or the snapshot, then the window)
				p.r.Release(tc, now)
			}
			c.cursor = seq
			c.lastAt = now
			c.visits++
			c.nextAt = now.Add(c.absence(rng))
		}
		for _, p := range policies {
			plan := p.r.Plan(now, snapshot)
			p.r.Applied(plan)
			_, _, _, b := p.r.Window()
			p.sumBytes += float64(b)
			p.peakBytes = max(p.peakBytes, b)
		}
	}

	return &result{policies: policies, events: seq, steps: steps, floor: floor}, nil
}

// print writes the table.
func (r *result) print(in params) {
	seq, steps, floor, policies := r.events, r.steps, r.floor, r.policies
	fmt.Printf("%d days, %d events (%.1f/min), snapshot %.0f MB, clients: %d pollers, %d bursty, %d long-absent, %d live; seed %d\n\n",
		in.days, seq, float64(seq)/float64(steps), in.snapMB, in.pollers, in.bursty, in.absent, in.live, in.seed)
	fmt.Printf("| policy | mean retained MB | x 72 h | peak retained MB | snapshot fallbacks (pollers / bursty / absent) | away < %s | fallback rate | snapshot MB served |\n", floor)
	fmt.Println("|---|---:|---:|---:|---|---:|---:|---:|")
	ref := policies[2].sumBytes // time: 72 h
	for _, p := range policies {
		total := p.fallbacks["poller"] + p.fallbacks["bursty"] + p.fallbacks["absent"]
		fmt.Printf("| %s | %.1f | %.3f | %.1f | %d (%d / %d / %d) | %d | %.2f%% | %.0f |\n", p.name,
			p.sumBytes/float64(steps)/(1<<20), p.sumBytes/max(ref, 1), float64(p.peakBytes)/(1<<20), total,
			p.fallbacks["poller"], p.fallbacks["bursty"], p.fallbacks["absent"], p.short,
			100*float64(total)/float64(max(p.visits, 1)),
			float64(total)*(in.snapMB))
	}
}

// poisson draws from Poisson(lambda) (Knuth; lambda is small).
func poisson(r *rand.Rand, lambda float64) int {
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}
