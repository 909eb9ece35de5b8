package slot

import "testing"

// Reference values from the Redis Cluster specification and CLUSTER KEYSLOT.
func TestOf(t *testing.T) {
	for key, want := range map[string]int{
		"123456789":            0x31C3 % Count,
		"foo":                  12182,
		"{user1000}.following": Of("user1000"),
		"foo{}{bar}":           Of("foo{}{bar}"),
		"foo{{bar}}zap":        Of("{bar"),
		"foo{bar}{zap}":        Of("bar"),
	} {
		if got := Of(key); got != want {
			t.Errorf("Of(%q) = %d, want %d", key, got, want)
		}
	}
	if Of("foo{}{bar}") == Of("bar") {
		t.Errorf("an empty tag must hash the whole key")
	}
}
