// Package sample is the gofatal analyzer's test input: each "want" comment
// is a report the analyzer must make there, and no other line may get one.
package sample

import (
	"errors"
	"helper"
	"sync"
	"testing"
)

type rig struct{ t *testing.T }

// runJob ends the test from wherever it runs (the scaleout bug's shape).
func (r *rig) runJob(j int) { // want runJob:`failsNow\(r.t.Fatalf\)`
	if j < 0 {
		r.t.Fatalf("bad job %d", j)
	}
}

func need(t testing.TB) string { // want need:`failsNow\(t.Fatal\)`
	t.Helper()
	t.Fatal("missing tool")
	return ""
}

func through(t testing.TB) string { return need(t) } // want through:`failsNow\(need -> t.Fatal\)`

func report(t *testing.T, err error) {
	if err != nil {
		t.Error(err) // Error does not end the goroutine: fine anywhere
	}
}

func worker(t *testing.T) { t.FailNow() } // want worker:`failsNow\(t.FailNow\)`

func Workers(t *testing.T) { // want Workers:`failsNow\(t.Fatal\)`
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
		_ = t.TempDir() // want `TempDir on a goroutine the test started calls`
	}()
	go func() {
		helper.Need(t) // want `Need on a goroutine the test started calls t.Fatal`
	}()
	go func() {
		report(t, errors.New("x")) // fine: t.Error
		go func() {
			t.Fatal("nested") // want `t.Fatal on a goroutine the test started`
		}()
	}()
	fail := func(msg string) { t.Fatal(msg) }
	go fail("a closure started by name") // want `fail runs on a new goroutine and calls t.Fatal`
	go func() {
		fail("a closure called on a goroutine") // want `fail on a goroutine the test started calls t.Fatal`
	}()
	fine := func() { t.Error("fine") }
	go fine()
	// On the test's own goroutine every one of them is fine.
	need(t)
	r.runJob(1)
	func() { t.Fatal("a closure called in place") }()
	fail("on the test's goroutine")
	close(jobs)
	wg.Wait()
}
