package claim

// Options returns the Keeper's options, defaults applied.
func (k *Keeper) Options() Options { return k.o }
