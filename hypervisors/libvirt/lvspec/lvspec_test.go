package lvspec

import "testing"

// Seed identity depends on exactly the ISO's inputs.
func TestSeedIdentity(t *testing.T) {
	base := SeedSpec{Pool: "p", Name: "n", InstanceID: "m1", Hostname: "h", UserData: "#cloud-config\n"}
	id := SeedIdentity(base)
	same := base
	same.Pool, same.Name = "other", "other"
	if SeedIdentity(same) != id {
		t.Error("pool or volume name changed the identity")
	}
	for _, mut := range []func(*SeedSpec){
		func(s *SeedSpec) { s.InstanceID = "m2" },
		func(s *SeedSpec) { s.Hostname = "h2" },
		func(s *SeedSpec) { s.UserData = "" },
		func(s *SeedSpec) { s.InstanceID, s.Hostname = "m1\x00h", "" },
	} {
		s := base
		mut(&s)
		if SeedIdentity(s) == id {
			t.Errorf("%+v has the identity of %+v", s, base)
		}
	}
}
