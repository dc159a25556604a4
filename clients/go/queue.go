package analytics

// queue holds encoded messages until the batcher takes them. It is guarded
// by Client.mu. held and heldBytes count queued plus in-flight messages:
// that is what MaxQueueSize and MaxQueueBytes bound, so a dead server cannot
// make memory grow through batches waiting in retries.
type queue struct {
	chunk     []byte // encoded messages are copied here, many per allocation
	buf       []item
	head      int // buf[head:] are the queued items
	bytes     int // encoded size of queued items, one separator each
	held      int
	heldBytes int
}

func (q *queue) len() int { return len(q.buf) - q.head }

// chunkSize is the allocation unit for encoded messages: about 200 typical
// ones. A chunk lives while any message in it is queued or in flight; as the
// queue is FIFO that pins at most a chunk or two beyond what is held.
const chunkSize = 64 << 10

// push copies an encoded message into the current chunk and queues it.
func (q *queue) push(data []byte, idStart, idEnd int) item {
	if cap(q.chunk)-len(q.chunk) < len(data) {
		q.chunk = make([]byte, 0, max(chunkSize, len(data)))
	}
	off := len(q.chunk)
	q.chunk = append(q.chunk, data...)
	it := item{data: q.chunk[off:len(q.chunk):len(q.chunk)], idStart: uint16(idStart), idEnd: uint16(idEnd)}
	q.buf = append(q.buf, it)
	q.bytes += len(it.data) + 1
	q.held++
	q.heldBytes += len(it.data)
	return it
}

// fits reports whether a message of n bytes may be held.
func (q *queue) fits(n, maxCount, maxBytes int) bool {
	return q.held < maxCount && q.heldBytes+n <= maxBytes
}

// ready reports whether a full batch, by count or by size, is waiting.
func (q *queue) ready(flushAt int) bool {
	return q.len() >= flushAt || batchOverhead+q.bytes > MaxBatchBytes
}

// take removes the next batch: as many queued messages, up to limit, as fit
// one request body (MaxBatchBytes). bySize reports that the byte limit, not
// the count or the queue's end, cut it.
func (q *queue) take(limit int) (batch []item, bySize bool) {
	pending := q.buf[q.head:]
	n, size := 0, batchOverhead
	for n < len(pending) && n < limit {
		s := len(pending[n].data) + 1
		if size+s > MaxBatchBytes {
			bySize = true
			break
		}
		size += s
		n++
	}
	if n == 0 {
		return nil, false
	}
	batch = make([]item, n)
	copy(batch, pending)
	clear(pending[:n]) // let the encoded bytes be collected once sent
	q.head += n
	q.bytes -= size - batchOverhead
	switch {
	case q.head == len(q.buf):
		q.buf, q.head = q.buf[:0], 0
	case q.head > cap(q.buf)/2:
		// Reclaim the consumed front before append grows the array.
		m := copy(q.buf, q.buf[q.head:])
		clear(q.buf[m:])
		q.buf, q.head = q.buf[:m], 0
	}
	return batch, bySize
}

// release forgets a batch that was delivered or dropped.
func (q *queue) release(batch []item) {
	q.held -= len(batch)
	for _, it := range batch {
		q.heldBytes -= len(it.data)
	}
}
