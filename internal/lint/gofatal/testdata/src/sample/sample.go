// Package sample is the gofatal analyzer's test input: each "want" comment
// is a report the analyzer must make there, and no other line may get one.
package sample

import (
	"errors"
	"sync"
	"testing"
)

type rig struct{ t *testing.T }

// runJob ends the test from wherever it runs (the scaleout bug's shape).
func (r *rig) runJob(j int) {
	if j < 0 {
		r.t.Fatalf("bad job %d", j)
	}
}

func need(t testing.TB) string {
	t.Helper()
	t.Fatal("missing tool")
	return ""
}

func through(t testing.TB) string { return need(t) } // two calls deep

func report(t *testing.T, err error) {
	if err != nil {
		t.Error(err) // Error does not end the goroutine: fine anywhere
	}
}

func worker(t *testing.T) { t.FailNow() }

func Workers(t *testing.T) {
	r := &rig{t: t}
	jobs := make(chan int)
	var wg sync.WaitGroup
	wg.Go(func() {
		for j := range jobs {
			r.runJob(j) // want `runJob on a goroutine the test started calls r.t.Fatalf`
		}
	})
	go func() {
		t.Fatal("direct") // want `t.Fatal on a goroutine the test started`
	}()
	go func() {
		t.Skip("skips end the goroutine too") // want `t.Skip on a goroutine`
	}()
	go func() {
		_ = through(t) // want `through on a goroutine the test started calls need -> t.Fatal`
	}()
	go worker(t) // want `worker runs on a new goroutine and calls t.FailNow`
	go func() {
		report(t, errors.New("x")) // fine: t.Error
		go func() {
			t.Fatal("nested") // want `t.Fatal on a goroutine the test started`
		}()
	}()
	// On the test's own goroutine every one of them is fine.
	need(t)
	r.runJob(1)
	func() { t.Fatal("a closure called in place") }()
	close(jobs)
	wg.Wait()
}
