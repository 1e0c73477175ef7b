/* The build script's probe (src/lib.rs, glibc::has_strlcpy): links only
 * where the C library has strlcpy, which libzmq then uses instead of its
 * own. */
#include <string.h>

int main(void) {
    char buf[2];
    return (int)strlcpy(buf, "a", sizeof buf) - 1;
}
