package eventid

import "bytes"

// utf8BOM is the UTF-8 byte order mark, EF BB BF.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// JSONText returns body without a leading UTF-8 byte order mark: the JSON
// text to read. Some senders put one before the JSON (Microsoft SharePoint
// list webhooks do), which RFC 8259 section 8.1 lets a parser ignore and
// JSON validators refuse. Only reading skips it: a signature covers the
// exact bytes, BOM included, and the upstream receives them unchanged.
func JSONText(body []byte) []byte {
	return bytes.TrimPrefix(body, utf8BOM)
}
