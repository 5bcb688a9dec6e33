package pgstore

// PauseTail stops this replica's event deliveries (its listener and its
// own commits' publication wait), as a process paused by SIGSTOP would;
// the returned func resumes them.
func (s *Store) PauseTail() (resume func()) {
	s.tail.mu.Lock()
	return s.tail.mu.Unlock
}

// TailGaps is how many catch-ups found seqs pruned before they were read.
func (s *Store) TailGaps() uint64 { return s.tail.gaps.Load() }
