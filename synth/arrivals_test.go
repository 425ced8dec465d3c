package synth

import "testing"

func TestArrivalsValidate(t *testing.T) {
	tests := []struct {
		arrivals    Arrivals
		wantErr     string // "" means valid
		wantDefault Arrivals
	}{
		{"", "", ArrivalsPoisson},
		{ArrivalsPoisson, "", ArrivalsPoisson},
		{ArrivalsConstant, "", ArrivalsConstant},
		{"bursty", `"bursty" is not one of poisson, constant`, "bursty"},
		{"Poisson", `"Poisson" is not one of poisson, constant`, "Poisson"},
	}
	for _, tt := range tests {
		t.Run(string(tt.arrivals), func(t *testing.T) {
			err := tt.arrivals.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
				t.Errorf("Validate: %v, want %s", err, tt.wantErr)
			}
			if got := tt.arrivals.OrDefault(); got != tt.wantDefault {
				t.Errorf("OrDefault = %q, want %q", got, tt.wantDefault)
			}
		})
	}
}
