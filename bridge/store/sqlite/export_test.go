package sqlite

// RowByRow returns o with the set path (groupset.go) turned off: every
// group runs batch by batch, one statement per row, as before it.
func RowByRow(o Options) Options {
	o.rowByRow = true
	return o
}
