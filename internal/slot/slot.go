// Package slot computes the Redis Cluster hash slot of a key, so that tests
// can check which keys share a slot without a cluster.
package slot

import "strings"

// Count is the number of hash slots of a Redis Cluster.
const Count = 16384

// Of returns the slot of key: CRC16 (XMODEM) of its hash tag (the part
// between the first '{' and the next '}', when not empty) or of the whole
// key, modulo 16384.
func Of(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % Count)
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
