package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// TextStats computes ParsedData (data layer 2) JSON statistics of text:
// bytes, lines, words, sentences and the most frequent words. Rehydrate
// sums the children's statistics (N:1), correcting for words and sentences
// cut by a chunk boundary: each child's merge state keeps its leading and
// trailing partial word (word runes and a UTF-8 sequence cut in two), and
// the merge re-counts the word across each seam. Word counts and top words
// are exact as long as each chunk has fewer than maxDistinctWords distinct
// words and no word cut by a boundary is longer than maxSeamWordBytes; a
// child output from another process (partialFromJSON) carries no edges, so
// its seams are corrected by count only.
type TextStats struct{}

// TextStatsResult is the JSON document TextStats produces.
type TextStatsResult struct {
	Bytes     uint64      `json:"bytes"`
	Lines     uint64      `json:"lines"`
	Words     uint64      `json:"words"`
	Sentences uint64      `json:"sentences"`
	TopWords  []WordCount `json:"top_words"`
}

// WordCount is one entry of TextStatsResult.TopWords.
type WordCount struct {
	Word  string `json:"word"`
	Count uint64 `json:"count"`
}

// textPartial is TextStats' merge state.
type textPartial struct {
	bytes, newlines, words, sentences uint64
	counts                            map[string]uint64
	endsNewline                       bool
	startsInWord, endsInWord          bool
	// endsMidSent: the last sentence has no terminator; hasSentence: at
	// least one sentence; leadNL/trailNL: newlines in the leading/trailing
	// white space (a blank line across the cut separates sentences).
	endsMidSent, hasSentence bool
	leadNL, trailNL          int
	// lead and trail are the bytes of the partial word at each edge: the
	// word runes before the first / after the last non-word rune, plus a
	// UTF-8 sequence cut at that edge. allWord: lead is the whole text (no
	// complete non-word rune). edges: lead and trail are known (false for
	// partialFromJSON and for an over-long seam word).
	lead, trail []byte
	allWord     bool
	edges       bool
}

const textStatsType = "application/json"

func (TextStats) Process(ctx context.Context, in *Input) (*Output, error) {
	p := analyzeText(in.Payload)
	return p.output()
}

func (TextStats) Rehydrate(ctx context.Context, parts []*Output) (*Output, error) {
	total := &textPartial{counts: map[string]uint64{}}
	var prev *textPartial
	for _, o := range parts {
		p, ok := o.Partial.(*textPartial)
		if !ok {
			p = partialFromJSON(o.Data)
		}
		if p.bytes == 0 {
			continue
		}
		total.bytes += p.bytes
		total.newlines += p.newlines
		total.words += p.words
		total.sentences += p.sentences
		for w, c := range p.counts {
			if _, ok := total.counts[w]; ok || len(total.counts) < maxDistinctWords {
				total.counts[w] += c
			}
		}
		if prev == nil {
			total.startsInWord, total.edges, total.allWord = p.startsInWord, p.edges, p.allWord
			total.lead, total.trail = slices.Clone(p.lead), slices.Clone(p.trail)
		} else {
			total.joinSeam(p)
			if prev.endsMidSent && p.hasSentence && prev.trailNL+p.leadNL < 2 && total.sentences > 0 {
				total.sentences--
			}
		}
		total.endsNewline = p.endsNewline
		total.endsInWord, total.endsMidSent = p.endsInWord, p.endsMidSent
		total.trailNL = p.trailNL
		if prev == nil {
			total.leadNL = p.leadNL
		}
		total.hasSentence = total.hasSentence || p.hasSentence
		prev = p
	}
	return total.output()
}

// joinSeam corrects the running total (whose text ends with total.trail)
// for the word cut between it and p, which follows: the tokens of the two
// edge fragments, counted on each side, are replaced by the tokens of the
// fragments joined. Then total.trail becomes the open word at the new end.
func (total *textPartial) joinSeam(p *textPartial) {
	if !total.edges || !p.edges {
		// No fragments: correct the word total only.
		if total.endsInWord && p.startsInWord && total.words > 0 {
			total.words--
		}
		total.edges, total.trail, total.lead = false, nil, nil
		return
	}
	if len(total.trail) > 0 && len(p.lead) > 0 {
		joined := make([]byte, 0, len(total.trail)+len(p.lead))
		joined = append(append(joined, total.trail...), p.lead...)
		forEachWord(total.trail, total.uncount)
		forEachWord(p.lead, total.uncount)
		forEachWord(joined, total.count)
		if total.allWord {
			total.lead = joined
		}
		if p.allWord {
			total.trail = joined
		} else {
			total.trail = slices.Clone(p.trail)
		}
		total.allWord = total.allWord && p.allWord
		if len(total.lead) > maxSeamWordBytes || len(total.trail) > maxSeamWordBytes {
			total.edges, total.trail, total.lead = false, nil, nil
		}
		return
	}
	total.allWord = false
	total.trail = slices.Clone(p.trail)
}

// count and uncount move one occurrence of w in and out of the totals
// (counts stay within maxDistinctWords; an uncounted word is not there).
func (p *textPartial) count(w string) {
	p.words++
	if _, ok := p.counts[w]; ok || len(p.counts) < maxDistinctWords {
		p.counts[w]++
	}
}

func (p *textPartial) uncount(w string) {
	if p.words > 0 {
		p.words--
	}
	switch c := p.counts[w]; {
	case c > 1:
		p.counts[w] = c - 1
	case c == 1:
		delete(p.counts, w)
	}
}

func (p *textPartial) output() (*Output, error) {
	res := TextStatsResult{Bytes: p.bytes, Words: p.words, Sentences: p.sentences, Lines: p.newlines, TopWords: topN(p.counts, topWords)}
	if p.bytes > 0 && !p.endsNewline {
		res.Lines++
	}
	data, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	return &Output{Data: data, ContentType: textStatsType, Layer: 2, Partial: p}, nil
}

// partialFromJSON rebuilds merge state from a child output that was not
// produced in this process (only totals and top words survive).
func partialFromJSON(b []byte) *textPartial {
	var r TextStatsResult
	p := &textPartial{counts: map[string]uint64{}}
	if json.Unmarshal(b, &r) != nil {
		return p
	}
	p.bytes, p.words, p.sentences, p.newlines, p.endsNewline = r.Bytes, r.Words, r.Sentences, r.Lines, true
	for _, wc := range r.TopWords {
		p.counts[wc.Word] = wc.Count
	}
	return p
}

func topN(counts map[string]uint64, n int) []WordCount {
	all := make([]WordCount, 0, len(counts))
	for w, c := range counts {
		all = append(all, WordCount{w, c})
	}
	slices.SortFunc(all, func(a, b WordCount) int {
		if a.Count != b.Count {
			if a.Count > b.Count {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Word, b.Word)
	})
	if len(all) > n {
		all = all[:n]
	}
	return all
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '\'' }

// forEachWord calls fn with every word of b, lower-cased: a maximal run of
// word runes (bytes that are not valid UTF-8 separate words).
func forEachWord(b []byte, fn func(w string)) {
	start := -1
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if isWordRune(r) && r != utf8.RuneError {
			if start < 0 {
				start = i
			}
		} else if start >= 0 {
			fn(strings.ToLower(string(b[start:i])))
			start = -1
		}
		i += n
	}
	if start >= 0 {
		fn(strings.ToLower(string(b[start:])))
	}
}

// edgeFragments returns the partial words at both edges of b (see
// textPartial.lead) and whether the lead is all of b.
func edgeFragments(b []byte) (lead, trail []byte, allWord bool) {
	i := 0
	for i < len(b) && i < utf8.UTFMax-1 && !utf8.RuneStart(b[i]) {
		i++ // the tail of a sequence cut at the start
	}
	for i < len(b) {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError || !isWordRune(r) {
			if !utf8.FullRune(b[i:]) {
				i = len(b) // a sequence cut at the end
			}
			break
		}
		i += n
	}
	if i == len(b) {
		return b, b, true
	}
	lead = b[:i]
	j := len(b)
	// A sequence cut at the end: a start byte with too few continuation bytes.
	for k := len(b) - 1; k >= 0 && k >= len(b)-(utf8.UTFMax-1); k-- {
		if utf8.RuneStart(b[k]) {
			if !utf8.FullRune(b[k:]) {
				j = k
			}
			break
		}
	}
	for j > 0 {
		r, n := utf8.DecodeLastRune(b[:j])
		if r == utf8.RuneError || !isWordRune(r) {
			break
		}
		j -= n
	}
	return lead, b[j:], false
}

func analyzeText(b []byte) *textPartial {
	p := &textPartial{bytes: uint64(len(b)), counts: map[string]uint64{}, edges: true}
	if len(b) == 0 {
		return p
	}
	p.newlines = uint64(bytes.Count(b, []byte{'\n'}))
	p.endsNewline = b[len(b)-1] == '\n'
	first, _ := utf8.DecodeRune(b)
	last, _ := utf8.DecodeLastRune(b)
	p.startsInWord, p.endsInWord = isWordRune(first), isWordRune(last)
	lead, trail, all := edgeFragments(b)
	p.allWord = all
	if len(lead) <= maxSeamWordBytes && len(trail) <= maxSeamWordBytes {
		p.lead, p.trail = slices.Clone(lead), slices.Clone(trail)
	} else {
		p.edges = false
	}
	forEachWord(b, p.count)
	sents, endsMid := splitSentences(b)
	p.sentences = uint64(len(sents))
	p.endsMidSent = endsMid
	p.hasSentence = len(sents) > 0
	for _, c := range b {
		if c == '\n' {
			p.leadNL++
		} else if c != ' ' && c != '\t' && c != '\r' {
			break
		}
	}
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			p.trailNL++
		} else if b[i] != ' ' && b[i] != '\t' && b[i] != '\r' {
			break
		}
	}
	return p
}

// splitSentences splits text into sentences: a sentence ends at a run of
// '.', '!' or '?' followed by white space or the end, or at a blank line.
// Inner white space is collapsed to one space. endsMid reports that the last
// sentence had no terminator (it may continue in the next chunk).
func splitSentences(b []byte) (out []string, endsMid bool) {
	var cur strings.Builder
	pendingSpace := false
	newlines := 0
	emit := func() {
		if cur.Len() > 0 {
			out = append(out, cur.String())
			cur.Reset()
		}
		pendingSpace = false
	}
	s := string(b)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		if unicode.IsSpace(r) {
			if r == '\n' {
				newlines++
				if newlines >= 2 {
					emit()
				}
			}
			pendingSpace = cur.Len() > 0
			continue
		}
		newlines = 0
		if pendingSpace {
			cur.WriteByte(' ')
			pendingSpace = false
		}
		cur.WriteRune(r)
		if r == '.' || r == '!' || r == '?' {
			// absorb a run of terminators and closing quotes
			for i < len(s) && strings.ContainsRune(".!?\"')]", rune(s[i])) {
				cur.WriteByte(s[i])
				i++
			}
			if i >= len(s) {
				emit()
				return out, false
			}
			next, _ := utf8.DecodeRuneInString(s[i:])
			if unicode.IsSpace(next) {
				emit()
			}
		}
	}
	endsMid = cur.Len() > 0
	emit()
	return out, endsMid
}

// Sentences is a Layer 1 splitter: it dehydrates text into one sub-entity
// per sentence in a new scope (when Layer 1 is on and the depth budget
// allows; beyond the amplification limit the peer groups whole sentences
// into larger sub-entities, docs/profile.md 6), and its result is one
// sentence per line. Without Layer 1, or when
// nesting deeper is not allowed, it returns the same text flat.
type Sentences struct{}

const sentencesType = "text/plain; charset=utf-8"

func (Sentences) Process(ctx context.Context, in *Input) (*Output, error) {
	sents, _ := splitSentences(in.Payload)
	if in.MaxDepth >= 0 && in.Depth+1 <= in.MaxDepth && len(sents) > 0 {
		subs := make([][]byte, len(sents))
		for i, s := range sents {
			subs[i] = []byte(s + "\n")
		}
		return &Output{Dehydrate: subs, ContentType: sentencesType}, nil
	}
	var b strings.Builder
	for _, s := range sents {
		b.WriteString(s)
		b.WriteByte('\n')
	}
	return &Output{Data: []byte(b.String()), ContentType: sentencesType}, nil
}

func (Sentences) Rehydrate(_ context.Context, parts []*Output) (*Output, error) {
	return &Output{Data: concatParts(parts), ContentType: sentencesType}, nil
}

// ConcatType makes Sentences a Concatenator: one sentence per line, in order.
func (Sentences) ConcatType(*Output) (string, uint8) { return sentencesType, 0 }
