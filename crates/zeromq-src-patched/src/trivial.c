/* The build script's probe (src/lib.rs, cxx11::has_cxx11): compiles, as
 * C++ with -std=c++11 and warnings as errors, where the compiler takes
 * that standard, which libzmq is then built with. */
int main(void) { return 0; }
