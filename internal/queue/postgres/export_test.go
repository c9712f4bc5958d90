package postgres

// QueuedEnqueues reports how many enqueues wait for a batch.
func QueuedEnqueues(q *Queue) int { return q.batch.Queued() }
