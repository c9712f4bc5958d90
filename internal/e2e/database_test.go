package e2e

import "context"

// Row reads one event's row; ok is false when there is none.
func (d *Database) Row(ctx context.Context, table, scope, eventID string) (Row, bool, error) {
	rows, err := d.Rows(ctx, table, scope)
	if err != nil {
		return Row{}, false, err
	}
	r, ok := rows[eventID]
	return r, ok, nil
}
