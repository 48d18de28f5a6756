// See declarations.h.
#include "gloo/declarations.h"
