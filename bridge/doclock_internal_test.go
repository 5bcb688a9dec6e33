package bridge

import "testing"

// TestLockFoundLooksAgain: lockFound releases the registry's mu to take
// the document's (the lock order), so what find names may change in
// between; it keeps only a document find still names, with both locks
// held, and leaves no other document locked.
func TestLockFoundLooksAgain(t *testing.T) {
	reg := &registry{docs: map[string]*docRun{}}
	env := &docEnv{reg: reg}
	d1, d2 := &docRun{env: env, id: "a"}, &docRun{env: env, id: "a"}
	reg.docs["a"] = d1
	calls := 0
	find := func() *docRun {
		calls++
		if calls == 2 { // another goroutine replaced the document meanwhile
			reg.docs["a"] = d2
		}
		return reg.docs["a"]
	}
	reg.mu.Lock()
	got := lockFound(reg, find)
	if got != d2 {
		t.Fatalf("lockFound kept %p, want the document find names now (%p)", got, d2)
	}
	if reg.mu.TryLock() {
		t.Fatal("lockFound returned without the registry's mu")
	}
	if d2.mu.TryLock() {
		t.Fatal("lockFound returned without the document's mutex")
	}
	if !d1.mu.TryLock() {
		t.Fatal("lockFound left the document it no longer names locked")
	}
	d1.mu.Unlock()
	reg.mu.Unlock()
	unlockFound(got)
	if !reg.mu.TryLock() || !d2.mu.TryLock() {
		t.Fatal("unlockFound left a lock held")
	}
	reg.mu.Unlock()
	d2.mu.Unlock()

	reg.mu.Lock()
	delete(reg.docs, "a")
	if got := lockFound(reg, func() *docRun { return reg.docs["a"] }); got != nil {
		t.Fatalf("lockFound found %p where find names none", got)
	}
	if reg.mu.TryLock() {
		t.Fatal("lockFound with nothing found must keep the registry's mu")
	}
	reg.mu.Unlock()
}

// TestEachDocRechecks: eachDoc runs fn only for the documents still says
// hold yet, each under its own mutex alone (document code takes the
// registry's only in short sections of its own), and releases it.
func TestEachDocRechecks(t *testing.T) {
	reg := &registry{docs: map[string]*docRun{}}
	env := &docEnv{reg: reg}
	docs := []*docRun{{env: env, id: "a"}, {env: env, id: "b"}, {env: env, id: "c"}}
	var ran []string
	eachDoc(reg, docs, func(d *docRun) bool {
		if reg.mu.TryLock() || d.mu.TryLock() {
			t.Errorf("still for %s ran without both locks", d.id)
		}
		return d.id != "b"
	}, func(d *docRun) {
		if d.mu.TryLock() {
			t.Errorf("fn for %s ran without its document's lock", d.id)
		}
		if !reg.mu.TryLock() {
			t.Errorf("fn for %s ran holding the registry's mu", d.id)
		} else {
			reg.mu.Unlock()
		}
		ran = append(ran, d.id)
	})
	if len(ran) != 2 || ran[0] != "a" || ran[1] != "c" {
		t.Fatalf("eachDoc ran fn for %v, want [a c]", ran)
	}
	for _, d := range docs {
		if !d.mu.TryLock() {
			t.Fatalf("eachDoc left %s locked", d.id)
		}
	}
	if !reg.mu.TryLock() {
		t.Fatal("eachDoc left the registry's mu held")
	}
}
