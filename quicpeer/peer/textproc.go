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
// cut by a chunk boundary; top words are exact as long as each chunk has
// fewer than maxDistinctWords distinct words.
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
		if prev != nil {
			if prev.endsInWord && p.startsInWord && total.words > 0 {
				total.words--
			}
			if prev.endsMidSent && p.hasSentence && prev.trailNL+p.leadNL < 2 && total.sentences > 0 {
				total.sentences--
			}
		}
		for w, c := range p.counts {
			if _, ok := total.counts[w]; ok || len(total.counts) < maxDistinctWords {
				total.counts[w] += c
			}
		}
		total.endsNewline = p.endsNewline
		total.endsInWord, total.endsMidSent = p.endsInWord, p.endsMidSent
		prev = p
	}
	return total.output()
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

func analyzeText(b []byte) *textPartial {
	p := &textPartial{bytes: uint64(len(b)), counts: map[string]uint64{}}
	if len(b) == 0 {
		return p
	}
	p.newlines = uint64(bytes.Count(b, []byte{'\n'}))
	p.endsNewline = b[len(b)-1] == '\n'
	first, _ := utf8.DecodeRune(b)
	last, _ := utf8.DecodeLastRune(b)
	p.startsInWord, p.endsInWord = isWordRune(first), isWordRune(last)
	var word []rune
	flush := func() {
		if len(word) == 0 {
			return
		}
		p.words++
		w := strings.ToLower(string(word))
		if _, ok := p.counts[w]; ok || len(p.counts) < maxDistinctWords {
			p.counts[w]++
		}
		word = word[:0]
	}
	for _, r := range string(b) {
		if isWordRune(r) {
			word = append(word, r)
		} else {
			flush()
		}
	}
	flush()
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
// allows), and its result is one sentence per line. Without Layer 1, or when
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
