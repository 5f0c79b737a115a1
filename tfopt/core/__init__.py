"""tfopt.core: the ground floor every layer may import (it imports none of them)."""
