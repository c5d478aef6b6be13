// Adversarial, threat 5: compiles the reference solution into itself. The build runs in a folder
// build/<module>/ of the repository, so the solution is two levels up. Must be a build error:
// inside the sandbox the repository, the build root and other submissions are not there.
#include "../../solution/submission.cu"
